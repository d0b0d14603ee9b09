//! Text classification: a word tokenizer, a frequency-ranked vocabulary and fixed-length
//! token sequences.

use std::collections::HashMap;

/// The id of padding (positions after the end of a short text).
pub const PAD: i64 = 0;
/// The id of a word not in the vocabulary.
pub const UNK: i64 = 1;

/// Splits `text` into lowercase words.
///
/// A word is a maximal run of ASCII letters and digits (`[A-Za-z0-9]+`), lowercased; every
/// other byte (whitespace, punctuation, and every byte of a non-ASCII character) separates
/// words. Working on bytes means that text in any encoding (the SpamAssassin corpus holds
/// Latin-1 as well as UTF-8) tokenizes without decoding errors, and the rule is easy to
/// replicate elsewhere (Python: `re.findall(rb"[A-Za-z0-9]+", text)`, then `.lower()`).
pub fn tokenize(text: impl AsRef<[u8]>) -> Vec<String> {
    words(text.as_ref()).map(|w| w.iter().map(|b| b.to_ascii_lowercase() as char).collect()).collect()
}

/// The words of `text` as byte slices, not yet lowercased.
fn words(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|b| !b.is_ascii_alphanumeric()).filter(|w| !w.is_empty())
}

/// A word-to-id mapping: id 0 is padding ([`PAD`]), id 1 unknown words ([`UNK`]), then the
/// most frequent words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    words: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Vocabulary {
    /// Builds a vocabulary of at most `max_size` ids (at least 2: padding and unknown) from
    /// the words of `documents` (see [`tokenize`]).
    ///
    /// Words are ranked by their total number of occurrences, most frequent first; words
    /// with equal counts are ranked alphabetically (byte order), so the result does not
    /// depend on the order of the documents.
    pub fn build<'a>(documents: impl IntoIterator<Item = &'a [u8]>, max_size: usize) -> Vocabulary {
        let mut counts: HashMap<String, u64> = HashMap::new();
        for doc in documents {
            for word in tokenize(doc) {
                *counts.entry(word).or_default() += 1;
            }
        }
        let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
        ranked.sort_unstable_by(|(wa, ca), (wb, cb)| cb.cmp(ca).then_with(|| wa.cmp(wb)));
        let kept = max_size.saturating_sub(2);
        Vocabulary::from_words(ranked.into_iter().take(kept).map(|(w, _)| w))
    }

    /// A vocabulary of the given words, which get ids 2, 3, ... in order (a repeated word
    /// keeps its first id and is not counted again).
    pub fn from_words(words: impl IntoIterator<Item = String>) -> Vocabulary {
        let mut vocab = Vocabulary { words: vec!["<pad>".into(), "<unk>".into()], ids: HashMap::new() };
        for word in words {
            if !vocab.ids.contains_key(&word) {
                vocab.ids.insert(word.clone(), vocab.words.len() as i64);
                vocab.words.push(word);
            }
        }
        vocab
    }

    /// The number of ids, padding and unknown included (the embedding table's row count).
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Always false: padding and unknown are always there.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The id of a (lowercase) word: [`UNK`] if it is not in the vocabulary.
    pub fn id(&self, word: &str) -> i64 {
        self.ids.get(word).copied().unwrap_or(UNK)
    }

    /// The word of an id (`<pad>` and `<unk>` for 0 and 1), if the id is in range.
    pub fn word(&self, id: i64) -> Option<&str> {
        usize::try_from(id).ok().and_then(|i| self.words.get(i)).map(String::as_str)
    }

    /// All words in id order, `<pad>` and `<unk>` first.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Encodes `text` as exactly `seq_len` ids: its first `seq_len` words (later words are
    /// dropped), unknown words as [`UNK`], then [`PAD`] up to `seq_len`.
    pub fn encode(&self, text: impl AsRef<[u8]>, seq_len: usize) -> Vec<i64> {
        let mut out: Vec<i64> = tokenize(text).iter().take(seq_len).map(|w| self.id(w)).collect();
        out.resize(seq_len, PAD);
        out
    }
}

/// Texts encoded as fixed-length token sequences, with integer labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDataset {
    /// Tokens per text.
    pub seq_len: usize,
    /// All token ids, `seq_len` per text, text after text.
    pub tokens: Vec<i64>,
    /// One label per text.
    pub labels: Vec<u8>,
}

impl TextDataset {
    /// Number of texts.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no texts.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The token ids of text `i`.
    pub fn sequence(&self, i: usize) -> &[i64] {
        &self.tokens[i * self.seq_len..(i + 1) * self.seq_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_lowercases_runs_of_ascii_alphanumerics() {
        assert_eq!(tokenize("Hello, World! It's 2002-08-22."), ["hello", "world", "it", "s", "2002", "08", "22"]);
        assert_eq!(tokenize(b"caf\xe9 na\xc3\xafve\tA1b2\r\n"), ["caf", "na", "ve", "a1b2"]);
        assert!(tokenize("  ... --- ").is_empty());
    }

    #[test]
    fn vocabulary_ranks_by_count_then_alphabetically() {
        let docs: [&[u8]; 3] = [b"b a c c", b"C d b", b"e"];
        let vocab = Vocabulary::build(docs, 5);
        assert_eq!(vocab.words(), ["<pad>", "<unk>", "c", "b", "a"]);
        assert_eq!(vocab, Vocabulary::build(docs.into_iter().rev(), 5));
        assert_eq!((vocab.id("c"), vocab.id("d"), vocab.word(4), vocab.word(9)), (2, UNK, Some("a"), None));
        assert_eq!(vocab.encode("A d C", 5), [4, UNK, 2, PAD, PAD]);
        assert_eq!(vocab.encode("a b c a b c", 4), [4, 3, 2, 4]);
        assert_eq!(Vocabulary::build(docs, 0).len(), 2);
        assert_eq!(Vocabulary::build(docs, 100).len(), 7);
    }
}
