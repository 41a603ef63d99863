//! The strict canonical form of a request-target (origin-form), and the query's parameters.
//!
//! The canonical path is both what the rules see and what goes upstream, so that the rules
//! and the upstream can never read one request two ways (`/public/../admin`, `/admin;x`,
//! `/%61dmin`, `//admin`). Anything with no single reading is refused rather than guessed.

/// Longest canonical path accepted.
pub const MAX_PATH: usize = 4096;

/// Why a request-target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("request-target contains a null or control byte")]
    Control,
    #[error("request-target contains raw non-ASCII bytes")]
    NonAscii,
    /// A request line splits at spaces, so none can be part of a target that arrived whole.
    #[error("request-target contains a raw space")]
    Space,
    #[error("request-target contains a fragment")]
    Fragment,
    #[error("request-target contains an invalid percent-encoded sequence")]
    BadEscape,
    #[error("request-target contains an encoded '/' (%2F) which is not allowed on this endpoint")]
    EncodedSlash,
    #[error("request-target would escape the path root")]
    Escape,
    #[error("request-target exceeds the configured maximum length")]
    TooLong,
    #[error("request-target is not a valid origin-form path")]
    NotOriginForm,
}

/// A canonical origin-form target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// Starts with `/`; no dot segments, no empty segments but a trailing `/`, no `;params`;
    /// unreserved escapes decoded, every other escape as uppercase `%HH`.
    pub path: String,
    /// The query as the client sent it (without its `?`), byte for byte.
    pub query: Option<String>,
}

impl Canonical {
    /// `path?query`, the request-target sent upstream.
    pub fn target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Canonicalise an origin-form request-target. `allow_encoded_slash` keeps `%2F` inside a
/// segment (as `%2F`) instead of refusing it.
pub fn canonicalize(target: &str, allow_encoded_slash: bool) -> Result<Canonical, PathError> {
    let raw = target.as_bytes();
    if raw.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(PathError::Control);
    }
    if raw.iter().any(|&b| b >= 0x80) {
        return Err(PathError::NonAscii);
    }
    if raw.contains(&b' ') {
        return Err(PathError::Space);
    }
    if raw.contains(&b'#') {
        return Err(PathError::Fragment);
    }
    if !target.starts_with('/') {
        return Err(PathError::NotOriginForm);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    // Escapes first, segment by segment (a decoded `/` never splits a segment).
    let mut out: Vec<String> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut trailing = false;
    for (i, seg) in segments.iter().enumerate() {
        let b = seg.as_bytes();
        let mut s = String::with_capacity(b.len());
        let mut j = 0;
        while j < b.len() {
            if b[j] == b'%' {
                let (Some(h), Some(l)) = (
                    b.get(j + 1).copied().and_then(hex),
                    b.get(j + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let v = h << 4 | l;
                if v < 0x20 || v == 0x7f {
                    return Err(PathError::Control);
                }
                if v == b'/' && !allow_encoded_slash {
                    return Err(PathError::EncodedSlash);
                }
                if is_unreserved(v) {
                    s.push(v as char);
                } else {
                    s.push_str(&format!("%{v:02X}"));
                }
                j += 3;
            } else {
                s.push(b[j] as char);
                j += 1;
            }
        }
        // `;params` go before dot resolution, so `..;x` is a dot segment and cannot hide one.
        if let Some(at) = s.find(';') {
            s.truncate(at);
        }
        match s.as_str() {
            "" | "." => trailing = i == last,
            ".." => {
                if out.pop().is_none() {
                    return Err(PathError::Escape);
                }
                trailing = i == last;
            }
            _ => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut path = String::with_capacity(path.len());
    for s in &out {
        path.push('/');
        path.push_str(s);
    }
    if trailing || out.is_empty() {
        path.push('/');
    }
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    Ok(Canonical { path, query })
}

/// Decode one query component: `%XX` and `+` as a space. Invalid escapes stay as they are.
fn decode_component(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's parameters, decoded, in order; a repeated key gives several entries.
pub fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = query else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode_component(k), decode_component(v)),
            None => (decode_component(p), String::new()),
        })
        .collect()
}
