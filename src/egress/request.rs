//! The first request head a client sends the proxy, parsed strictly: either
//! `CONNECT host:port` (a tunnel for any TCP) or an absolute-form plain-HTTP request to forward.
//!
//! httparse does the tokenising. On top of it, OpenShell's header hygiene (each failure is a
//! 400 with an empty body): UTF-8 only; a request line of exactly three parts and
//! `HTTP/1.0` or `HTTP/1.1`; no bare LF, no obs-fold; no `Content-Length` with
//! `Transfer-Encoding`, no differing duplicate `Content-Length`, no `Transfer-Encoding` other
//! than exactly `chunked`. A head is at most [`MAX_HEAD`] bytes including its blank line;
//! past that the client gets 431.

use std::net::IpAddr;

/// The largest request head the proxy reads (OpenShell's limit).
pub const MAX_HEAD: usize = 8192;

/// Header slots given to httparse; more headers than this in 8 KiB is a 431 as well.
const MAX_HEADERS: usize = 128;

/// A parsed first request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub target: Target,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Names as sent (case kept), values as sent.
    pub headers: Vec<(String, String)>,
}

/// What the client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`.
    Connect(HostPort),
    /// An absolute-form `http://` request.
    Forward {
        dest: HostPort,
        /// The URI's authority as written (no userinfo): the Host header sent upstream.
        authority: String,
        /// Origin-form path and query, `/` at least.
        path_and_query: String,
    },
}

/// A destination. `host` keeps the client's spelling (used for resolution), without IPv6
/// brackets; [`HostPort::policy_host`] is what policy and logs see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    /// Lower-case, as OpenShell matches and logs it.
    pub fn policy_host(&self) -> String {
        self.host.to_ascii_lowercase()
    }

    /// `host:port`, with brackets around an IPv6 literal.
    pub fn display(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.policy_host(), self.port)
        } else {
            format!("{}:{}", self.policy_host(), self.port)
        }
    }
}

/// Why a head was refused, and so which response the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// 431, empty body.
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    /// 400, empty body.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// 400, JSON `invalid_connect_target`: the client learns what a CONNECT target must be.
    #[error("CONNECT target '{0}' is not host:port")]
    ConnectTarget(String),
    /// 400, plain body `Use CONNECT for HTTPS URLs`.
    #[error("an https:// URL was sent for forwarding")]
    HttpsUrl,
    /// 400, JSON `unsupported_proxy_scheme`.
    #[error("unsupported proxy scheme '{0}'")]
    Scheme(String),
}

/// Where the head ends in `buf`: the length of the head including its blank line. `Err` for
/// a blank line made of bare LFs (a strict parser cannot accept it, and waiting for a CRLF one
/// would wait for ever).
pub fn head_end(buf: &[u8]) -> Option<Result<usize, HeadError>> {
    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
        return Some(Ok(i + 4));
    }
    if buf.windows(2).any(|w| w == b"\n\n") {
        return Some(Err(HeadError::Malformed("bare LF line ending")));
    }
    None
}

/// Parse one complete head (exactly the bytes [`head_end`] measured).
pub fn parse_head(buf: &[u8]) -> Result<Head, HeadError> {
    if buf.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let text = std::str::from_utf8(buf).map_err(|_| HeadError::Malformed("not UTF-8"))?;
    for (i, b) in buf.iter().enumerate() {
        if *b == b'\n' && (i == 0 || buf[i - 1] != b'\r') {
            return Err(HeadError::Malformed("bare LF"));
        }
        if *b == b'\r' && buf.get(i + 1) != Some(&b'\n') {
            return Err(HeadError::Malformed("bare CR"));
        }
    }
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let parts: Vec<&str> = request_line.split(' ').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) {
        return Err(HeadError::Malformed(
            "request line is not METHOD SP target SP version",
        ));
    }
    if parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0" {
        return Err(HeadError::Malformed("version is not HTTP/1.0 or HTTP/1.1"));
    }
    if lines.any(|l| l.starts_with([' ', '\t'])) {
        return Err(HeadError::Malformed("obs-fold"));
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n == buf.len() => {}
        Ok(_) => return Err(HeadError::Malformed("incomplete head")),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed("httparse refused the head")),
    }
    let method = req.method.unwrap_or_default().to_string();
    let raw_target = req.path.unwrap_or_default();
    let minor_version = req.version.unwrap_or(1);
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let v = std::str::from_utf8(h.value).map_err(|_| HeadError::Malformed("not UTF-8"))?;
        headers.push((h.name.to_string(), v.to_string()));
    }
    framing(&headers)?;
    let target = if method == "CONNECT" {
        Target::Connect(connect_target(raw_target)?)
    } else {
        forward_target(raw_target)?
    };
    Ok(Head {
        method,
        target,
        minor_version,
        headers,
    })
}

/// The body-framing rules: one unambiguous length, or exactly `chunked`.
fn framing(headers: &[(String, String)]) -> Result<(), HeadError> {
    let mut cl: Option<&str> = None;
    let mut te = 0;
    for (n, v) in headers {
        if n.eq_ignore_ascii_case("content-length") {
            let v = v.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HeadError::Malformed("Content-Length is not a number"));
            }
            if cl.is_some_and(|c| c != v) {
                return Err(HeadError::Malformed("differing Content-Length headers"));
            }
            cl = Some(v);
        } else if n.eq_ignore_ascii_case("transfer-encoding") {
            te += 1;
            if !v.trim().eq_ignore_ascii_case("chunked") || te > 1 {
                return Err(HeadError::Malformed("Transfer-Encoding other than chunked"));
            }
        }
    }
    if cl.is_some() && te > 0 {
        return Err(HeadError::Malformed(
            "Content-Length with Transfer-Encoding",
        ));
    }
    Ok(())
}

/// A DNS name (labels of letters, digits, `-` and `_`, an optional final dot) or an IP
/// literal. Anything else can match no rule and must not reach a resolver.
fn valid_host(h: &str) -> bool {
    if h.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = h.strip_suffix('.').unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|p| *p != 0)
}

/// `host:port` or `[v6]:port`.
fn split_authority(a: &str) -> Option<HostPort> {
    let (host, p) = if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        h.parse::<std::net::Ipv6Addr>().ok()?;
        (h, tail.strip_prefix(':')?)
    } else {
        let (h, p) = a.rsplit_once(':')?;
        if h.contains(':') {
            return None;
        }
        (h, p)
    };
    let port = port(p)?;
    valid_host(host).then(|| HostPort {
        host: host.to_string(),
        port,
    })
}

fn connect_target(t: &str) -> Result<HostPort, HeadError> {
    split_authority(t).ok_or_else(|| HeadError::ConnectTarget(t.to_string()))
}

fn forward_target(t: &str) -> Result<Target, HeadError> {
    if t.contains('#') {
        return Err(HeadError::Malformed("fragment in the request target"));
    }
    let (scheme, rest) = match t.split_once("://") {
        Some((s, r))
            if !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
        {
            (s, r)
        }
        _ => {
            return Err(HeadError::Malformed(
                "the request target is not an absolute URI",
            ));
        }
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(HeadError::HttpsUrl);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HeadError::Scheme(scheme.to_string()));
    }
    let uri: http::Uri = t
        .parse()
        .map_err(|_| HeadError::Malformed("the request target is not a valid URI"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(HeadError::Malformed("userinfo in the request target"));
    }
    let dest = if authority.ends_with(']') || !authority.contains(':') {
        let host = authority
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(authority);
        if !valid_host(host) {
            return Err(HeadError::Malformed("bad host in the request target"));
        }
        HostPort {
            host: host.to_string(),
            port: 80,
        }
    } else {
        split_authority(authority).ok_or(HeadError::Malformed(
            "bad host or port in the request target",
        ))?
    };
    let path_and_query = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") => "/".to_string(),
        Some(p) if p.starts_with('?') => format!("/{p}"),
        Some(p) => p.to_string(),
    };
    Ok(Target::Forward {
        dest,
        authority: authority.to_string(),
        path_and_query,
    })
}
