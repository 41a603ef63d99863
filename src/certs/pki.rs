//! The mTLS material: one CA, a server certificate and a client certificate, as PEM.
//!
//! The CA key signs exactly these two certificates and is then dropped: it is never written
//! anywhere, so nobody can mint further client certificates that the gateway would trust.
//! Rotation is "delete the Secrets and run the Job again".

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use super::error::CertsError;

/// PEM text of one certificate and its key, plus the CA that signed it.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

pub struct Bundle {
    pub ca_pem: String,
    pub server: Leaf,
    pub client: Leaf,
}

/// The server's DNS names: the Service name in every form a pod can resolve, plus localhost
/// for port-forwards, plus whatever the operator adds.
pub fn server_names(service: &str, namespace: &str, domain: &str, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{domain}"),
        "localhost".to_owned(),
    ];
    for e in extra {
        if !names.contains(e) {
            names.push(e.clone());
        }
    }
    names
}

fn san(name: &str) -> Result<SanType, CertsError> {
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let ia5 = name
        .to_owned()
        .try_into()
        .map_err(|_| CertsError::BadSan { name: name.into() })?;
    Ok(SanType::DnsName(ia5))
}

fn base_params(cn: &str, days: u32) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "openshell-sandbox");
    p.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    // An hour of slack for nodes whose clocks run behind the one that ran the Job.
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(i64::from(days));
    p
}

pub fn generate(server_sans: &[String], days: u32) -> Result<Bundle, CertsError> {
    let rc = |source| CertsError::Generate { source };

    let ca_key = KeyPair::generate().map_err(rc)?;
    let mut ca = base_params("openshell-sandbox CA", days);
    // pathlen 0: this CA signs leaves only.
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).map_err(rc)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().map_err(rc)?;
    let mut server = base_params("openshell", days);
    server.subject_alt_names = server_sans
        .iter()
        .map(|n| san(n))
        .collect::<Result<_, _>>()?;
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_pem = server.signed_by(&server_key, &issuer).map_err(rc)?.pem();

    let client_key = KeyPair::generate().map_err(rc)?;
    let mut client = base_params("openshell-client", days);
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_pem = client.signed_by(&client_key, &issuer).map_err(rc)?.pem();

    Ok(Bundle {
        server: Leaf {
            cert_pem: server_pem,
            key_pem: server_key.serialize_pem(),
            ca_pem: ca_pem.clone(),
        },
        client: Leaf {
            cert_pem: client_pem,
            key_pem: client_key.serialize_pem(),
            ca_pem: ca_pem.clone(),
        },
        ca_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn server_names_cover_every_service_form() {
        let n = server_names("openshell", "rt", "cluster.local", &["gw.example".into()]);
        assert_eq!(
            n,
            [
                "openshell",
                "openshell.rt",
                "openshell.rt.svc",
                "openshell.rt.svc.cluster.local",
                "localhost",
                "gw.example"
            ]
        );
    }

    #[test]
    fn leaves_verify_against_the_ca_for_their_purpose_only() {
        let names = server_names("openshell", "rt", "cluster.local", &["10.1.2.3".into()]);
        let b = generate(&names, 30).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&b.ca_pem)).unwrap();
        let anchors = roots.roots.clone();
        let now = UnixTime::now();
        let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;

        let server = der(&b.server.cert_pem);
        let server = webpki::EndEntityCert::try_from(&server).unwrap();
        for name in [
            "openshell.rt.svc.cluster.local",
            "openshell.rt",
            "localhost",
            "10.1.2.3",
        ] {
            let sn = ServerName::try_from(name).unwrap();
            server
                .verify_for_usage(
                    algs.all,
                    &anchors,
                    &[],
                    now,
                    webpki::KeyUsage::server_auth(),
                    None,
                    None,
                )
                .unwrap();
            server.verify_is_valid_for_subject_name(&sn).unwrap();
        }
        let wrong = ServerName::try_from("openshell.other.svc").unwrap();
        assert!(server.verify_is_valid_for_subject_name(&wrong).is_err());
        assert!(
            server
                .verify_for_usage(
                    algs.all,
                    &anchors,
                    &[],
                    now,
                    webpki::KeyUsage::client_auth(),
                    None,
                    None
                )
                .is_err(),
            "the server certificate must not authenticate a client"
        );

        let client = der(&b.client.cert_pem);
        let client = webpki::EndEntityCert::try_from(&client).unwrap();
        client
            .verify_for_usage(
                algs.all,
                &anchors,
                &[],
                now,
                webpki::KeyUsage::client_auth(),
                None,
                None,
            )
            .unwrap();
        assert_eq!(b.client.ca_pem, b.ca_pem);
        assert!(b.server.key_pem.contains("PRIVATE KEY"));
    }

    #[test]
    fn a_bad_extra_name_is_rejected() {
        let err = generate(&["bad name\u{e9}".into()], 1).err().unwrap();
        assert!(err.to_string().contains("bad name"), "{err}");
    }
}
