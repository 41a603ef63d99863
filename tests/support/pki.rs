//! A throwaway PKI made fresh for each test gateway: a CA, a server certificate for
//! `localhost`/127.0.0.1, and client certificates, written as the files a pod would mount.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(30);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, names: &[&str], server: bool, expired: bool) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        if expired {
            params.not_before = now - Duration::days(10);
            params.not_after = now - Duration::days(1);
        } else {
            params.not_before = now - Duration::days(1);
            params.not_after = now + Duration::days(30);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, true, false)
    }

    pub fn client(&self) -> Leaf {
        self.leaf(&["sandbox-client"], false, false)
    }

    pub fn expired_client(&self) -> Leaf {
        self.leaf(&["sandbox-client"], false, true)
    }
}

/// Client TLS files laid out like the pod's Secret mount.
pub struct ClientFiles {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientFiles {
    pub fn write(dir: &Path, ca_pem: &str, leaf: &Leaf) -> ClientFiles {
        std::fs::create_dir_all(dir).unwrap();
        let f = ClientFiles {
            dir: dir.to_owned(),
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&f.ca, ca_pem).unwrap();
        std::fs::write(&f.cert, &leaf.cert_pem).unwrap();
        std::fs::write(&f.key, &leaf.key_pem).unwrap();
        f
    }
}
