//! `certs generate --out-dir DIR`: the same set as files, laid out like the Secret mounts:
//! `server/{tls.crt,tls.key,ca.crt}`, `client/{tls.crt,tls.key,ca.crt}`, `client-ca/ca.crt`.
//! Keys are 0600, certificates 0644; files are created with O_EXCL, never overwritten.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::CertsError;
use super::pki;

const FILES: [(&str, &str); 7] = [
    ("server", "tls.crt"),
    ("server", "tls.key"),
    ("server", "ca.crt"),
    ("client", "tls.crt"),
    ("client", "tls.key"),
    ("client", "ca.crt"),
    ("client-ca", "ca.crt"),
];

fn contents<'a>(b: &'a pki::Bundle, dir: &str, file: &str) -> &'a str {
    let leaf = match dir {
        "server" => &b.server,
        "client" => &b.client,
        _ => return &b.ca_pem,
    };
    match file {
        "tls.crt" => &leaf.cert_pem,
        "tls.key" => &leaf.key_pem,
        _ => &leaf.ca_pem,
    }
}

pub fn generate(out: &Path, sans: &[String], days: u32) -> Result<Vec<String>, CertsError> {
    let paths: Vec<PathBuf> = FILES.iter().map(|(d, f)| out.join(d).join(f)).collect();
    let (present, missing): (Vec<_>, Vec<_>) =
        paths.iter().partition(|p| fs::symlink_metadata(p).is_ok());
    if missing.is_empty() {
        return Ok(paths
            .iter()
            .map(|p| format!("kept existing {}", p.display()))
            .collect());
    }
    if !present.is_empty() {
        return Err(CertsError::Partial {
            present: present.iter().map(|p| p.display().to_string()).collect(),
            missing: missing.iter().map(|p| p.display().to_string()).collect(),
        });
    }
    let bundle = pki::generate(sans, days)?;
    let mut written: Vec<PathBuf> = Vec::new();
    let mut lines = Vec::new();
    for ((dir, file), path) in FILES.iter().zip(&paths) {
        let result = write_new(path, contents(&bundle, dir, file), file.ends_with(".key"));
        if let Err(e) = result {
            // Leave nothing half-made: a rerun must find an empty set, not a partial one.
            for p in &written {
                let _ = fs::remove_file(p);
            }
            return Err(e);
        }
        written.push(path.clone());
        lines.push(format!("wrote {}", path.display()));
    }
    Ok(lines)
}

fn write_new(path: &Path, text: &str, secret: bool) -> Result<(), CertsError> {
    let err = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(err)?;
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}
