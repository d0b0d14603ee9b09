//! The device–edge protocol of edgefreeze (EdgeMove split training).
//!
//! - [`pb`]: the messages and the `Edge` gRPC service of `proto/edgefreeze.proto`, as
//!   prost/tonic code. The code is **generated once and committed**
//!   (`src/generated/edgefreeze.v1.rs`), not generated in a build script: building the
//!   pure-Rust protobuf compiler (protox) and tonic's code generator costs about 1.5
//!   minutes on the project's 2-core machine on every clean build, and no `protoc` binary
//!   is needed either way. `tools/wire-codegen` regenerates it (`--check` compares), and
//!   the test `generated_code_matches_proto` fails when the `.proto` changed without a
//!   regeneration (the generated file records a fingerprint of the `.proto`).
//! - [`tensor`]: tensors as raw little-endian bytes with dtype and shape, encoded and
//!   decoded with checks (known dtype, byte length = elements × dtype size, rank and
//!   element limits), and checked against the [`pb::PortSpec`] a session announced.
//! - [`auth`]: device credentials in request metadata, the tokens file, token checks in
//!   constant time, token generation.
//! - [`header`]: the header every message carries, and checks that a reply matches.
//! - [`Limits`]: message size and tensor limits shared by both ends.

pub mod auth;
#[cfg(feature = "autodiff")]
pub mod convert;
mod error;
pub mod header;
pub mod tensor;

pub use error::WireError;

/// The generated messages and service (package `edgefreeze.v1`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!("generated/edgefreeze.v1.rs");
}

/// The `.proto` the generated code comes from.
pub const PROTO: &str = include_str!("../proto/edgefreeze.proto");

/// Client type of the `Edge` service over a tonic channel, with credentials attached to
/// every call.
pub type EdgeClient = pb::edge_client::EdgeClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, auth::Credentials>,
>;

/// Limits both ends enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded gRPC message, in bytes (tonic refuses bigger ones with
    /// `OutOfRange` / `ResourceExhausted` before decoding them).
    pub max_message_bytes: usize,
    /// Largest tensor rank.
    pub max_rank: usize,
    /// Most elements in one tensor.
    pub max_elements: usize,
}

/// 64 MiB: a micro-batch of 64 ResNet-20 activations at the widest cut is 3.1 MiB, and a
/// whole ResNet-20 edge state about 3.3 MiB (SGD with momentum); bigger models need
/// `--max-message-bytes`.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES, max_rank: 8, max_elements: DEFAULT_MAX_MESSAGE_BYTES }
    }
}

/// Nanoseconds since the Unix epoch on this machine's clock (timestamps in messages).
pub fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Connects to an edge server (`http://HOST:PORT` or `HOST:PORT`) with the given
/// credentials on every call and the given message limits.
pub async fn connect(address: &str, credentials: auth::Credentials, limits: &Limits) -> Result<EdgeClient, WireError> {
    let uri = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
    let endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| WireError::Connect { address: address.to_string(), message: e.to_string() })?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| WireError::Connect { address: address.to_string(), message: e.to_string() })?;
    Ok(pb::edge_client::EdgeClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(limits.max_message_bytes))
}

/// FNV-1a (64 bit), the fingerprint `tools/wire-codegen` records of the `.proto`.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    /// Guards against editing the `.proto` without regenerating the committed code.
    #[test]
    fn generated_code_matches_proto() {
        let generated = include_str!("generated/edgefreeze.v1.rs");
        let first = generated.lines().next().unwrap_or_default();
        let expected = format!("fingerprint {:016x}", super::fingerprint(super::PROTO.as_bytes()));
        assert!(
            first.contains(&expected),
            "src/generated/edgefreeze.v1.rs was not generated from the current proto/edgefreeze.proto \
             ({first:?} lacks {expected:?}): run `cargo run --manifest-path tools/wire-codegen/Cargo.toml`"
        );
    }
}
