//! Fuzzes the whole import path on arbitrary bytes: parse, sort, op checks, constant
//! folding, shape inference, layer analysis and re-encoding. Any panic is a bug: bad
//! input must come back as an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(model) = edgefreeze_graph::parse_model(data, None) else { return };
    let _ = edgefreeze_graph::save::encode_model(&model);
    let Ok(model) = edgefreeze_graph::prepare(model) else { return };
    let _ = edgefreeze_graph::analyse(&model);
    let _ = edgefreeze_graph::save::encode_model(&model);
});
