//! The globs of OpenShell's network rules: host patterns (labels split by `.`) and binary
//! patterns (segments split by `/`).
//!
//! OpenShell matches them with Rego's `glob.match(pattern, [delimiter], value)`: `*` is any run
//! of characters without the delimiter (also an empty one), `**` any run at all, `?` one
//! character that is not the delimiter. A pattern is a glob only when it contains `*`;
//! otherwise it is compared as a plain string, so a `?` there is a literal. Character classes
//! (`[...]`), alternatives (`{a,b}`) and `\\` escapes are glob syntax too, and are refused at
//! load rather than half-supported: a pattern that means something else here than it does in
//! OpenShell must not load.
//!
//! Matching is a single pass over the value per token (a set of reachable positions), so a
//! pattern full of stars costs `tokens × length`, never backtracking.

/// A compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    delim: u8,
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(Vec<u8>),
    /// `*`: any run without the delimiter.
    Star,
    /// `**`: any run.
    Super,
    /// `?`: one byte that is not the delimiter.
    One,
}

/// Why a glob pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "glob pattern '{pattern}' uses `{what}`, which this supervisor does not support (only `*`, `**` and `?`)"
)]
pub struct GlobError {
    pub pattern: String,
    pub what: char,
}

impl Glob {
    /// Compile `pattern` with `delim` as the separator (`.` for hosts, `/` for paths).
    pub fn new(pattern: &str, delim: u8) -> Result<Glob, GlobError> {
        if let Some(what) = pattern
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(GlobError {
                pattern: pattern.to_string(),
                what,
            });
        }
        let b = pattern.as_bytes();
        let mut tokens = Vec::new();
        let mut lit = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let t = match b[i] {
                b'*' if b.get(i + 1) == Some(&b'*') => {
                    // Three or more stars are still "any run".
                    while b.get(i + 1) == Some(&b'*') {
                        i += 1;
                    }
                    Some(Token::Super)
                }
                b'*' => Some(Token::Star),
                b'?' => Some(Token::One),
                c => {
                    lit.push(c);
                    None
                }
            };
            if let Some(t) = t {
                if !lit.is_empty() {
                    tokens.push(Token::Literal(std::mem::take(&mut lit)));
                }
                tokens.push(t);
            }
            i += 1;
        }
        if !lit.is_empty() {
            tokens.push(Token::Literal(lit));
        }
        Ok(Glob {
            source: pattern.to_string(),
            delim,
            tokens,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the whole of `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        let v = value.as_bytes();
        // reach[i]: the tokens so far can consume exactly v[..i].
        let mut reach = vec![false; v.len() + 1];
        reach[0] = true;
        for t in &self.tokens {
            let mut next = vec![false; v.len() + 1];
            match t {
                Token::Literal(l) => {
                    for i in 0..=v.len() {
                        if reach[i] && v[i..].starts_with(l) {
                            next[i + l.len()] = true;
                        }
                    }
                }
                Token::One => {
                    for i in 0..v.len() {
                        if reach[i] && v[i] != self.delim {
                            next[i + 1] = true;
                        }
                    }
                }
                Token::Star => {
                    // From each reachable position, any run up to the next delimiter.
                    let mut open = false;
                    for i in 0..=v.len() {
                        open |= reach[i];
                        if open {
                            next[i] = true;
                        }
                        if i < v.len() && v[i] == self.delim {
                            open = false;
                        }
                    }
                }
                Token::Super => {
                    let mut open = false;
                    for i in 0..=v.len() {
                        open |= reach[i];
                        next[i] = open;
                    }
                }
            }
            reach = next;
            if !reach.contains(&true) {
                return false;
            }
        }
        reach[v.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(p: &str, v: &str) -> bool {
        Glob::new(p, b'.').unwrap().matches(v)
    }

    fn path(p: &str, v: &str) -> bool {
        Glob::new(p, b'/').unwrap().matches(v)
    }

    #[test]
    fn star_is_one_label_or_part_of_one() {
        assert!(host("*.example.com", "a.example.com"));
        assert!(!host("*.example.com", "example.com"));
        assert!(!host("*.example.com", "a.b.example.com"));
        assert!(host("*-api.example.com", "eu-api.example.com"));
        assert!(!host("*-api.example.com", "eu.x-api.example.com"));
        assert!(host("api.*.example.com", "api.eu.example.com"));
        assert!(!host("api.*.example.com", "api.eu.west.example.com"));
    }

    #[test]
    fn double_star_is_one_or_more_labels_before_a_dot() {
        assert!(host("**.example.com", "a.example.com"));
        assert!(host("**.example.com", "a.b.c.example.com"));
        assert!(!host("**.example.com", "example.com"));
        assert!(!host("**.example.com", "aexample.com"));
        assert!(!host("**.example.com", "a.example.com.evil"));
    }

    #[test]
    fn question_mark_is_one_non_delimiter() {
        assert!(host("?.*.com", "a.b.com"));
        assert!(!host("?.*.com", "ab.b.com"));
        assert!(!path("/usr/bin/?*", "/usr/bin/"));
    }

    #[test]
    fn path_star_stays_in_one_segment() {
        assert!(path("/usr/bin/*", "/usr/bin/node"));
        assert!(!path("/usr/bin/*", "/usr/bin/sub/node"));
        assert!(path("/usr/**", "/usr/bin/sub/node"));
        assert!(path("**/python3", "/usr/local/bin/python3"));
        assert!(!path("/opt/*/bin/x", "/opt/a/b/bin/x"));
    }

    #[test]
    fn many_stars_do_not_backtrack() {
        let p = "*a*a*a*a*a*a*a*a*a*a*a*a*b";
        let v = "a".repeat(4000);
        assert!(!path(p, &v));
        assert!(path(p, &format!("{v}b")));
    }

    #[test]
    fn classes_alternatives_and_escapes_are_refused() {
        for p in ["/usr/bin/[ab]*", "{a,b}.*.com", "*\\.com"] {
            assert!(Glob::new(p, b'/').is_err(), "{p}");
        }
    }
}
