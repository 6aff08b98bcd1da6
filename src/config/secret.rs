//! A token's secret: kept only as its SHA-256 hash, compared in constant
//! time, and the key of the HMAC that signs the console's sessions.

/// A token's secret, kept only as its SHA-256 hash, compared in constant
/// time; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Option<[u8; 32]>);

impl Secret {
    /// The secret as written, hashed; empty, none.
    #[cfg(feature = "config-file")]
    pub(super) fn new(secret: &str) -> Secret {
        use sha2::Digest;
        Secret((!secret.is_empty()).then(|| sha2::Sha256::digest(secret.as_bytes()).into()))
    }

    /// Whether there is no secret (one written empty).
    #[cfg(feature = "config-file")]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `given` is this secret, in time independent of where they
    /// differ.
    pub fn matches(&self, given: &str) -> bool {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let Some(hash) = &self.0 else {
            return false;
        };
        let given: [u8; 32] = sha2::Sha256::digest(given.as_bytes()).into();
        hash.ct_eq(&given).into()
    }

    /// The HMAC-SHA256 of `message` under this secret (keyed by its hash,
    /// never by the secret itself): what signs the console's sessions, so
    /// that every replica with the same token checks them, and a changed
    /// or removed secret ends them. `None` for a token without a secret.
    pub fn seal(&self, message: &[u8]) -> Option<[u8; 32]> {
        use hmac::Mac;
        let hash = self.0.as_ref()?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(hash)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"scheduler console session\0");
        mac.update(message);
        Some(mac.finalize().into_bytes().into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}
