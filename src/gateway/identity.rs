//! The sandbox identity from the drivers' environment: Kubernetes sets `OPENSHELL_SANDBOX_UID/GID` (and an empty
//! `OPENSHELL_OCI_IMAGE_USER`); Docker and Podman set the UID/GID to `""` and put the image's
//! `USER` in `OPENSHELL_OCI_IMAGE_USER`, which fills whichever of uid and gid is omitted.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("OPENSHELL_OCI_IMAGE_USER `{spec}`: no user `{name}` in {path}")]
    NoUser {
        spec: String,
        name: String,
        path: PathBuf,
    },
    #[error("OPENSHELL_OCI_IMAGE_USER `{spec}`: no group `{name}` in {path}")]
    NoGroup {
        spec: String,
        name: String,
        path: PathBuf,
    },
    #[error("OPENSHELL_OCI_IMAGE_USER `{spec}`: reading {path}: {source}")]
    Read {
        spec: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("OPENSHELL_OCI_IMAGE_USER `{spec}`: id `{id}` is out of range (0 ..= 4294967294)")]
    Range { spec: String, id: String },
}

/// The uid and gid the image's `USER` names. The gid is `None` when the spec names no group
/// and the user has no passwd entry (the policy then defaults it to the uid).
pub fn oci_user(spec: &str, etc: &Path) -> Result<(Option<u32>, Option<u32>), IdentityError> {
    let spec_s = spec.trim();
    if spec_s.is_empty() {
        return Ok((None, None));
    }
    let (user, group) = match spec_s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec_s, None),
    };
    let passwd = etc.join("passwd");
    let mut uid = None;
    let mut primary_gid = None;
    if !user.is_empty() {
        let entry = if user.bytes().all(|b| b.is_ascii_digit()) {
            let id = number(spec_s, user)?;
            uid = Some(id);
            find(spec_s, &passwd, |f| f.get(2) == Some(&user))?
        } else {
            let e = find(spec_s, &passwd, |f| f.first() == Some(&user))?.ok_or_else(|| {
                IdentityError::NoUser {
                    spec: spec_s.into(),
                    name: user.into(),
                    path: passwd.clone(),
                }
            })?;
            uid = Some(number(spec_s, e.get(2).map_or("", String::as_str))?);
            Some(e)
        };
        if let Some(e) = entry {
            primary_gid = e.get(3).and_then(|g| number(spec_s, g).ok());
        }
    }
    let gid = match group.filter(|g| !g.is_empty()) {
        None => primary_gid,
        Some(g) if g.bytes().all(|b| b.is_ascii_digit()) => Some(number(spec_s, g)?),
        Some(g) => {
            let path = etc.join("group");
            let e = find(spec_s, &path, |f| f.first() == Some(&g))?.ok_or_else(|| {
                IdentityError::NoGroup {
                    spec: spec_s.into(),
                    name: g.into(),
                    path: path.clone(),
                }
            })?;
            Some(number(spec_s, e.get(2).map_or("", String::as_str))?)
        }
    };
    Ok((uid, gid))
}

fn number(spec: &str, s: &str) -> Result<u32, IdentityError> {
    let range = || IdentityError::Range {
        spec: spec.into(),
        id: s.into(),
    };
    // 2^32-1 is (uid_t)-1, setresuid's "no change"; never an identity.
    let n: u64 = s.parse().map_err(|_| range())?;
    u32::try_from(n)
        .ok()
        .filter(|n| *n != u32::MAX)
        .ok_or_else(range)
}

/// The fields of the first `name:x:id:...` line of a colon file matching `pick`. A missing
/// file is no match (a numeric USER needs no passwd entry).
fn find(
    spec: &str,
    path: &Path,
    pick: impl Fn(&[&str]) -> bool,
) -> Result<Option<Vec<String>>, IdentityError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(IdentityError::Read {
                spec: spec.into(),
                path: path.to_owned(),
                source,
            });
        }
    };
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if pick(&fields) {
            return Ok(Some(fields.into_iter().map(str::to_owned).collect()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_user_forms() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(d.path().join("group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let r = |s| oci_user(s, d.path()).unwrap();
        assert_eq!(r(""), (None, None));
        assert_eq!(r("app"), (Some(1001), Some(1002)));
        assert_eq!(r("1001"), (Some(1001), Some(1002)));
        assert_eq!(r("4242"), (Some(4242), None));
        assert_eq!(r("4242:7"), (Some(4242), Some(7)));
        assert_eq!(r("app:staff"), (Some(1001), Some(50)));
        assert!(matches!(
            oci_user("ghost", d.path()),
            Err(IdentityError::NoUser { .. })
        ));
        assert!(matches!(
            oci_user("app:ghost", d.path()),
            Err(IdentityError::NoGroup { .. })
        ));
        assert!(matches!(
            oci_user("4294967295", d.path()),
            Err(IdentityError::Range { .. })
        ));
    }
}
