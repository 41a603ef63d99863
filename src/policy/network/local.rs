//! The addresses that are never a destination (loopback, link-local, unspecified:
//! [`is_always_blocked`]), and the hosts that can only mean them: a rule for one of those can
//! never be used, because the proxy connects from the supervisor's network namespace and
//! refuses such destinations whatever a rule says. `--allow-net` refuses them when it is parsed; a policy
//! file keeps OpenShell's behaviour (accepted, each connection refused by the address
//! checks).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Why `host` (a name, an IP literal without brackets, or a numeric form getaddrinfo would
/// read as an IPv4 address) can never be reached through the proxy; `None` when it may be.
pub fn unreachable_host(host: &str) -> Option<String> {
    let lower = host.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let loopback_names = [
        "localhost",
        "localhost.localdomain",
        "localhost6",
        "localhost6.localdomain6",
        "ip6-localhost",
        "ip6-loopback",
    ];
    if loopback_names.contains(&name) || name.ends_with(".localhost") {
        return Some(format!("{host} {}", LOOPBACK));
    }
    let ip = lower
        .parse::<IpAddr>()
        .ok()
        .or_else(|| inet_aton(&lower).map(IpAddr::V4))?;
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    let what = if ip.is_loopback() || v4.is_some_and(|a| a.is_loopback()) {
        LOOPBACK
    } else if ip.is_unspecified() || v4.is_some_and(|a| a.is_unspecified()) {
        "is the unspecified address, which names the local machine: the proxy never connects to it"
    } else if is_always_blocked(ip) {
        "is a link-local address (the cloud metadata service among them): the proxy never connects to one"
    } else {
        return None;
    };
    Some(format!("{host} {what}"))
}

const LOOPBACK: &str = "is loopback, the sandbox's own: the proxy never connects to a loopback address (from the supervisor's side it would be the supervisor's, not the sandbox's), so the rule could never be used; a server the command starts in the sandbox is reached directly, without a rule";

/// inet_aton(3)'s forms, which getaddrinfo accepts for a numeric host: one to four parts,
/// each decimal, octal (leading `0`) or hex (`0x`), the last filling the remaining bytes
/// (`127.1`, `0x7f.0.0.1`, `2130706433`).
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let n = if let Some(h) = p.strip_prefix("0x") {
            u32::from_str_radix(h, 16).ok()?
        } else if p.len() > 1 && p.starts_with('0') {
            u32::from_str_radix(&p[1..], 8).ok()?
        } else {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u32>().ok()?
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    let mut v: u32 = 0;
    for (i, n) in head.iter().enumerate() {
        if *n > 255 {
            return None;
        }
        v |= n << (24 - 8 * i);
    }
    let room = 32 - 8 * head.len() as u32;
    if room < 32 && u64::from(*last) >= 1u64 << room {
        return None;
    }
    Some(Ipv4Addr::from(v | last))
}

/// The address ranges that are refused whatever the policy says: loopback, link-local and
/// unspecified, in both families and in IPv4-mapped form. `allowed_ips` may not overlap them.
pub fn always_blocked_nets() -> [IpNet; 9] {
    let n = |s: &str| s.parse::<IpNet>().expect("constant");
    [
        n("127.0.0.0/8"),
        n("169.254.0.0/16"),
        n("0.0.0.0/32"),
        n("::1/128"),
        n("::/128"),
        n("fe80::/10"),
        n("::ffff:127.0.0.0/104"),
        n("::ffff:169.254.0.0/112"),
        n("::ffff:0.0.0.0/128"),
    ]
}

/// Whether `ip` is in [`always_blocked_nets`].
pub fn is_always_blocked(ip: IpAddr) -> bool {
    always_blocked_nets().iter().any(|n| n.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_forms_are_named() {
        for h in [
            "localhost",
            "LOCALHOST.",
            "a.localhost",
            "ip6-localhost",
            "127.0.0.1",
            "127.8.9.10",
            "127.1",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "2130706433",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            let why = unreachable_host(h).unwrap_or_else(|| panic!("{h} is loopback"));
            assert!(why.starts_with(&format!("{h} is loopback")), "{why}");
        }
        for h in ["0.0.0.0", "0", "::"] {
            assert!(unreachable_host(h).unwrap().contains("unspecified"), "{h}");
        }
        for h in ["169.254.169.254", "fe80::1"] {
            assert!(unreachable_host(h).unwrap().contains("link-local"), "{h}");
        }
        for h in [
            "pub.test",
            "localhost.example.com",
            "10.77.0.10",
            "192.88.99.10",
            "8.8.8.8",
            "2001:db8::1",
            "1.2.3",
            "0x7g.0.0.1",
            "256.0.0.1",
            "*.localhost.example",
        ] {
            assert_eq!(unreachable_host(h), None, "{h}");
        }
        assert_eq!(inet_aton("1.2.3"), Some(Ipv4Addr::new(1, 2, 0, 3)));
        assert_eq!(inet_aton("1.65536"), Some(Ipv4Addr::new(1, 1, 0, 0)));
        assert_eq!(inet_aton("1.2.65536"), None);
    }
}
