//! Device authentication: credentials travel in the metadata of every call; the edge
//! server checks them against a tokens file of `device_id token` lines.
//!
//! Tokens are compared in constant time, so a wrong token's timing says nothing about
//! how much of it was right. A session is bound to the device that opened it; the edge
//! checks that on every call (in the `edge` crate).

use crate::WireError;
use std::collections::HashMap;
use std::path::Path;
use tonic::metadata::{MetadataMap, MetadataValue};

/// Metadata key of the device id.
pub const DEVICE_KEY: &str = "x-edgefreeze-device";
/// Metadata key of the token (`Bearer TOKEN`).
pub const AUTHORIZATION_KEY: &str = "authorization";
/// Shortest token the edge accepts (in characters).
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest identifier or token (in characters).
pub const MAX_ID_CHARS: usize = 128;

/// A device id and its token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    device_id: String,
    token: String,
}

impl std::fmt::Debug for Credentials {
    /// Never prints the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("device_id", &self.device_id).finish_non_exhaustive()
    }
}

impl Credentials {
    /// Checks both parts: a device id of 1 to 128 characters of `[A-Za-z0-9._-]`, a token
    /// of 16 to 128 such characters.
    pub fn new(device_id: &str, token: &str) -> Result<Credentials, WireError> {
        check_identifier("device id", device_id)?;
        check_token(token)?;
        Ok(Credentials { device_id: device_id.to_string(), token: token.to_string() })
    }

    /// The device id.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// Writes the credentials into a request's metadata.
    pub fn attach(&self, metadata: &mut MetadataMap) -> Result<(), WireError> {
        // Both were checked to be plain ASCII, which metadata values always accept.
        let device = MetadataValue::try_from(self.device_id.as_str())
            .map_err(|e| WireError::Unauthenticated(format!("device id: {e}")))?;
        let token = MetadataValue::try_from(format!("Bearer {}", self.token))
            .map_err(|e| WireError::Unauthenticated(format!("token: {e}")))?;
        metadata.insert(DEVICE_KEY, device);
        metadata.insert(AUTHORIZATION_KEY, token);
        Ok(())
    }

    /// Reads the credentials a request carries.
    pub fn from_metadata(metadata: &MetadataMap) -> Result<Credentials, WireError> {
        let text = |key: &str| -> Result<&str, WireError> {
            metadata
                .get(key)
                .ok_or_else(|| WireError::Unauthenticated(format!("no {key} metadata")))?
                .to_str()
                .map_err(|_| WireError::Unauthenticated(format!("{key} metadata is not text")))
        };
        let device = text(DEVICE_KEY)?;
        let token = text(AUTHORIZATION_KEY)?
            .strip_prefix("Bearer ")
            .ok_or_else(|| WireError::Unauthenticated(format!("{AUTHORIZATION_KEY} metadata is not `Bearer TOKEN`")))?;
        Credentials::new(device, token).map_err(|e| WireError::Unauthenticated(e.to_string()))
    }
}

/// Attaches the credentials to every call of a client (`EdgeClient::with_interceptor`).
impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.attach(request.metadata_mut())?;
        Ok(request)
    }
}

/// The devices an edge server accepts, from a tokens file.
#[derive(Clone, Default)]
pub struct TokenTable {
    tokens: HashMap<String, String>,
}

impl std::fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenTable").field("devices", &self.tokens.len()).finish()
    }
}

impl TokenTable {
    /// Reads a tokens file.
    pub fn load(path: &Path) -> Result<TokenTable, WireError> {
        let text = std::fs::read_to_string(path).map_err(|e| WireError::TokensFile {
            path: path.display().to_string(),
            line: None,
            message: e.to_string(),
        })?;
        TokenTable::parse(&text, &path.display().to_string())
    }

    /// Parses `device_id token` lines (blank lines and `#` comments are skipped; a device
    /// listed twice is an error). `source` names the file in errors.
    pub fn parse(text: &str, source: &str) -> Result<TokenTable, WireError> {
        let mut tokens = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |message: String| WireError::TokensFile { path: source.to_string(), line: Some(i + 1), message };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [device, token] = fields[..] else {
                return Err(bad(format!("expected `device_id token`, found {} fields", fields.len())));
            };
            Credentials::new(device, token).map_err(|e| bad(e.to_string()))?;
            if tokens.insert(device.to_string(), token.to_string()).is_some() {
                return Err(bad(format!("device {device:?} is listed twice")));
            }
        }
        if tokens.is_empty() {
            return Err(WireError::TokensFile {
                path: source.to_string(),
                line: None,
                message: "lists no device".into(),
            });
        }
        Ok(TokenTable { tokens })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no device is listed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Checks a device's credentials; returns its id.
    pub fn check<'c>(&self, credentials: &'c Credentials) -> Result<&'c str, WireError> {
        let expected = self
            .tokens
            .get(&credentials.device_id)
            .ok_or_else(|| WireError::Unauthenticated(format!("unknown device {:?}", credentials.device_id)))?;
        if !constant_time_eq(expected.as_bytes(), credentials.token.as_bytes()) {
            return Err(WireError::Unauthenticated(format!("wrong token for device {:?}", credentials.device_id)));
        }
        Ok(&credentials.device_id)
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new random token: 32 bytes from the operating system's random source, as 64 hex digits.
pub fn generate_token() -> Result<String, WireError> {
    Ok(hex(&random_bytes::<32>()?))
}

/// Random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], WireError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| WireError::Random(e.to_string()))?;
    Ok(bytes)
}

/// Lower-case hex digits of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a device id, run id or session id: 1 to 128 characters of `[A-Za-z0-9._-]`,
/// not starting with a dot (so one can name a folder safely).
pub fn check_identifier(what: &'static str, value: &str) -> Result<(), WireError> {
    let bad = |message: &str| WireError::Identifier { what, value: value.to_string(), message: message.to_string() };
    if value.is_empty() || value.len() > MAX_ID_CHARS {
        return Err(bad("must have 1 to 128 characters"));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(bad("may only hold letters, digits, '.', '_' and '-'"));
    }
    if value.starts_with('.') {
        return Err(bad("must not start with '.'"));
    }
    Ok(())
}

fn check_token(token: &str) -> Result<(), WireError> {
    let bad =
        |message: &str| WireError::Identifier { what: "token", value: "(hidden)".into(), message: message.to_string() };
    if token.len() < MIN_TOKEN_CHARS || token.len() > MAX_ID_CHARS {
        return Err(bad("must have 16 to 128 characters"));
    }
    if !token.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(bad("may only hold letters, digits, '.', '_' and '-'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "0123456789abcdef0123";
    const T2: &str = "fedcba9876543210fedc";

    #[test]
    fn tokens_file_accepts_listed_devices_only() {
        let table =
            TokenTable::parse(&format!("# devices\nphone-1 {T1}\n\n  phone-2\t{T2}  \n"), "tokens.txt").unwrap();
        assert_eq!(table.len(), 2);
        assert_eq!(table.check(&Credentials::new("phone-1", T1).unwrap()).unwrap(), "phone-1");
        let wrong = table.check(&Credentials::new("phone-1", T2).unwrap()).unwrap_err();
        assert!(wrong.to_string().contains("wrong token for device \"phone-1\""));
        assert!(matches!(wrong, WireError::Unauthenticated(_)));
        let unknown = table.check(&Credentials::new("phone-3", T1).unwrap()).unwrap_err();
        assert!(unknown.to_string().contains("unknown device \"phone-3\""));
        assert_eq!(tonic::Status::from(unknown).code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn tokens_file_errors_name_the_line() {
        let e = |text: &str| TokenTable::parse(text, "t.txt").unwrap_err().to_string();
        assert_eq!(e(&format!("a {T1}\nb\n")), "tokens file t.txt line 2: expected `device_id token`, found 1 fields");
        assert!(e(&format!("a {T1}\na {T2}\n")).contains("line 2: device \"a\" is listed twice"));
        assert!(e("a short\n").contains("line 1: token \"(hidden)\": must have 16 to 128 characters"));
        assert!(e(&format!("../x {T1}\n")).contains("may only hold letters"));
        assert!(e("# nothing\n").contains("lists no device"));
    }

    #[test]
    fn credentials_travel_in_metadata() {
        let c = Credentials::new("phone-1", T1).unwrap();
        let mut md = MetadataMap::new();
        c.attach(&mut md).unwrap();
        assert_eq!(md.get(AUTHORIZATION_KEY).unwrap(), &format!("Bearer {T1}"));
        assert_eq!(Credentials::from_metadata(&md).unwrap(), c);
        assert!(!format!("{c:?}").contains(T1), "Debug must not print the token");

        let mut missing = MetadataMap::new();
        missing.insert(DEVICE_KEY, MetadataValue::from_static("phone-1"));
        assert!(Credentials::from_metadata(&missing).unwrap_err().to_string().contains("no authorization metadata"));
        missing.insert(AUTHORIZATION_KEY, MetadataValue::from_static("Basic abc"));
        assert!(Credentials::from_metadata(&missing).unwrap_err().to_string().contains("not `Bearer TOKEN`"));
    }

    #[test]
    fn generated_tokens_are_valid_and_differ() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        Credentials::new("d", &a).unwrap();
    }

    #[test]
    fn identifiers_are_safe_folder_names() {
        check_identifier("run id", "run-2024.01_a").unwrap();
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_identifier("run id", bad).is_err(), "{bad:?}");
        }
    }
}
