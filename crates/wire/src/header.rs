//! The header every message carries: session id, step, micro-batch and model version.

use crate::WireError;
use crate::pb::Header;

impl Header {
    /// A header.
    pub fn new(session_id: &str, step: u64, micro_batch: u32, model_version: u64) -> Header {
        Header { session_id: session_id.to_string(), step, micro_batch, model_version }
    }

    /// Checks that `reply` answers a message with this header: same session, step,
    /// micro-batch and model version. `what` names the reply in the error.
    pub fn check_reply(&self, what: &str, reply: &Header) -> Result<(), WireError> {
        if reply != self {
            return Err(WireError::Mismatch {
                message: format!("{what} is for {} but {} was sent", describe(reply), describe(self)),
            });
        }
        Ok(())
    }
}

/// `session S step 3 micro-batch 1 model version 2`.
pub fn describe(h: &Header) -> String {
    format!("session {} step {} micro-batch {} model version {}", h.session_id, h.step, h.micro_batch, h.model_version)
}

/// The header of a message, which must be present.
pub fn required<'a>(header: Option<&'a Header>, message: &str) -> Result<&'a Header, WireError> {
    header.ok_or_else(|| WireError::message(format!("{message} has no header")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_must_match_their_request() {
        let sent = Header::new("s1", 3, 1, 2);
        sent.check_reply("gradient", &sent.clone()).unwrap();
        let e = sent.check_reply("gradient", &Header::new("s1", 3, 0, 2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gradient is for session s1 step 3 micro-batch 0 model version 2 but session s1 step 3 micro-batch 1 \
             model version 2 was sent"
        );
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::FailedPrecondition);
        assert!(required(None, "MicroBatchUp").unwrap_err().to_string().contains("MicroBatchUp has no header"));
    }
}
