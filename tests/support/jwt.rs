//! The gateway's sandbox JWT: EdDSA over Ed25519, signed and checked with ring.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

pub struct JwtIssuer {
    key: Ed25519KeyPair,
    pub kid: String,
    pub gateway_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub sandbox_id: String,
    pub exp: u64,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl JwtIssuer {
    pub fn new() -> JwtIssuer {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        JwtIssuer {
            key: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
            kid: "test-kid".into(),
            gateway_id: "openshell".into(),
        }
    }

    /// A token for `sandbox_id`; `ttl_secs` 0 means it never expires.
    pub fn mint(&self, sandbox_id: &str, ttl_secs: u64) -> String {
        let header = serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": self.kid});
        let iat = now();
        let aud = format!("openshell-gateway:{}", self.gateway_id);
        let claims = serde_json::json!({
            "sub": format!("spiffe://openshell/sandbox/{sandbox_id}"),
            "iss": aud,
            "aud": aud,
            "iat": iat,
            "exp": if ttl_secs == 0 { 0 } else { iat + ttl_secs },
            "sandbox_id": sandbox_id,
        });
        let signing_input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = self.key.sign(signing_input.as_bytes());
        format!("{signing_input}.{}", B64.encode(sig.as_ref()))
    }

    /// Check a token as the gateway does: EdDSA only, our kid, issuer and audience, and expiry
    /// with 60 s leeway. Returns the claims or why it was refused.
    pub fn verify(&self, token: &str) -> Result<Claims, String> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT".into());
        };
        let header: serde_json::Value =
            serde_json::from_slice(&B64.decode(h).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        if header["alg"] != "EdDSA" {
            return Err("alg must be EdDSA".into());
        }
        if header["kid"] != self.kid.as_str() {
            return Err("unknown kid".into());
        }
        let sig = B64.decode(s).map_err(|e| e.to_string())?;
        UnparsedPublicKey::new(&ED25519, self.key.public_key().as_ref())
            .verify(format!("{h}.{p}").as_bytes(), &sig)
            .map_err(|_| "bad signature".to_string())?;
        let claims: serde_json::Value =
            serde_json::from_slice(&B64.decode(p).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        let want = format!("openshell-gateway:{}", self.gateway_id);
        for k in ["iss", "aud", "exp", "sub"] {
            if claims.get(k).is_none() {
                return Err(format!("missing claim {k}"));
            }
        }
        if claims["iss"] != want.as_str() || claims["aud"] != want.as_str() {
            return Err("wrong issuer or audience".into());
        }
        let exp = claims["exp"].as_u64().ok_or("exp is not a number")?;
        if exp != 0 && exp + 60 < now() {
            return Err("token expired".into());
        }
        Ok(Claims {
            sandbox_id: claims["sandbox_id"].as_str().unwrap_or_default().to_owned(),
            exp,
        })
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
