//! What a connection may reach once a rule allowed it: the address checks after resolution
//! (OpenShell's SSRF plan). Pure functions on addresses.
//!
//! - Always refused: loopback, link-local, unspecified ([`is_always_blocked`]), whatever the
//!   rule says: the supervisor's own loopback and the cloud metadata address are never a
//!   destination.
//! - A rule's `allowed_ips` replaces the internal-address check with "every address is inside
//!   one of these"; an IP literal must resolve to itself; an exact host the user declared may
//!   resolve to a private address. On those three plans the Kubernetes control-plane ports are
//!   refused as well.
//! - Anything else (wildcard and hostless matches) reaches public addresses only
//!   ([`is_internal`]), on any port.
//!
//! Every address of the answer must pass (all or nothing), and the dial then uses exactly the
//! checked list, so a second resolution can never swap in another address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::policy::network::IpNet;
pub use crate::policy::network::is_always_blocked;

/// Ports refused on every plan but [`AddressPlan::PublicOnly`]: etcd, the API server and the
/// kubelet.
pub const CONTROL_PLANE_PORTS: [u16; 5] = [2379, 2380, 6443, 10250, 10255];

/// How the resolved addresses of an allowed connection are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPlan {
    /// The first matching endpoint with extended config lists `allowed_ips`.
    AllowedIps(Vec<IpNet>),
    /// The request named an IP literal that is not always blocked.
    IpLiteral(IpAddr),
    /// A matching rule declares this exact host: private addresses are fine.
    ExactHost,
    /// Wildcard or hostless match: public addresses only.
    PublicOnly,
}

impl AddressPlan {
    /// The `<kind>` of the client's `… blocked: <kind>` detail.
    pub fn kind(&self) -> &'static str {
        match self {
            AddressPlan::AllowedIps(_) => "allowed_ips check failed",
            AddressPlan::IpLiteral(_) | AddressPlan::ExactHost => "declared endpoint check failed",
            AddressPlan::PublicOnly => "internal address",
        }
    }
}

/// A refused destination: the kind the client sees and the detail the log gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressDenial {
    pub kind: &'static str,
    pub detail: String,
}

/// Check every address of one resolution against the plan (all or nothing; an empty answer
/// is refused too).
pub fn check(
    plan: &AddressPlan,
    host: &str,
    port: u16,
    addrs: &[IpAddr],
) -> Result<(), AddressDenial> {
    let deny = |detail: String| AddressDenial {
        kind: plan.kind(),
        detail,
    };
    if addrs.is_empty() {
        return Err(deny(format!("{host}:{port} resolved to no address")));
    }
    if !matches!(plan, AddressPlan::PublicOnly) && CONTROL_PLANE_PORTS.contains(&port) {
        return Err(deny(format!("port {port} is a blocked control-plane port")));
    }
    for &ip in addrs {
        if is_always_blocked(ip) {
            return Err(deny(format!(
                "{host}:{port} resolves to always-blocked address {ip}"
            )));
        }
        match plan {
            AddressPlan::AllowedIps(nets) => {
                if !nets.iter().any(|n| n.contains(&ip)) {
                    return Err(deny(format!(
                        "{host}:{port} resolves to {ip} which is not in allowed_ips"
                    )));
                }
            }
            AddressPlan::IpLiteral(want) => {
                if ip != *want {
                    return Err(deny(format!("{host}:{port} resolves to {ip}, not {want}")));
                }
            }
            AddressPlan::ExactHost => {}
            AddressPlan::PublicOnly => {
                if is_internal(ip) {
                    return Err(deny(format!(
                        "{host}:{port} resolves to internal address {ip}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Not a public unicast address: everything [`is_always_blocked`], RFC 1918, CGNAT, the IETF
/// protocol block, the documentation and benchmarking nets, broadcast and the other reserved
/// IPv4 blocks, multicast; IPv6 ULA, site-local, documentation, multicast, the IPv4-compatible
/// block; and IPv4-mapped, IPv4-translated (`::ffff:0:0/96`), NAT64 (`64:ff9b::/96`,
/// `64:ff9b:1::/48`) and 6to4 (`2002::/16`) forms of an internal IPv4 address. OpenShell's
/// classifier stops short of the last four and of IPv6 documentation; a public-only rule must
/// not reach a private host through them (a translator on the path turns them into it).
pub fn is_internal(ip: IpAddr) -> bool {
    if is_always_blocked(ip) {
        return true;
    }
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        // 0.0.0.0/8 "this network"
        || o[0] == 0
        // 100.64.0.0/10 shared address space (CGNAT)
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        // 192.0.0.0/24 IETF protocol assignments
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        // 198.18.0.0/15 benchmarking
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        // 240.0.0.0/4 reserved
        || o[0] >= 240
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return internal_v4(v4) || is_always_blocked(IpAddr::V4(v4));
    }
    let embedded = |hi: u16, lo: u16| {
        let v4 = Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
        internal_v4(v4)
    };
    // fc00::/7 unique local
    (s[0] & 0xfe00) == 0xfc00
        // fec0::/10 site-local (deprecated)
        || (s[0] & 0xffc0) == 0xfec0
        // ff00::/8 multicast
        || (s[0] & 0xff00) == 0xff00
        // 2001:db8::/32 documentation
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // ::/96 IPv4-compatible (deprecated)
        || s[..6] == [0; 6]
        // 64:ff9b::/96 NAT64 of an internal IPv4 address
        || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && embedded(s[6], s[7]))
        // ::ffff:0:0/96 IPv4-translated (SIIT) form of an internal IPv4 address
        || (s[..6] == [0, 0, 0, 0, 0xffff, 0] && embedded(s[6], s[7]))
        // 64:ff9b:1::/48 local-use NAT64
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        // 2002::/16 6to4 of an internal IPv4 address
        || (s[0] == 0x2002 && embedded(s[1], s[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn classifier() {
        for s in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.10",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "255.255.255.255",
            "0.1.2.3",
            "224.0.0.1",
            "240.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "fc00::1",
            "fd12::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "::a00:1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "::ffff:0:a00:1",
            "::ffff:0:7f00:1",
            "64:ff9b:1::1",
            "2002:a00:1::",
            "2002:7f00:1::",
            "::1",
            "fe80::1",
        ] {
            assert!(is_internal(ip(s)), "{s} is internal");
        }
        // 192.88.99.0/24 (the retired 6to4 relay anycast block) is public to OpenShell's
        // classifier and to ours: the egress tests own an address there.
        for s in [
            "192.88.99.10",
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "::ffff:0:808:808",
            "2002:808:808::",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_internal(ip(s)), "{s} is public");
        }
    }

    #[test]
    fn plans() {
        let pubs = [ip("192.88.99.10")];
        let private = [ip("10.77.0.10")];
        let mixed = [ip("192.88.99.10"), ip("10.77.0.10")];
        let lo = [ip("127.0.0.1")];
        let p = AddressPlan::PublicOnly;
        assert!(check(&p, "h", 80, &pubs).is_ok());
        assert_eq!(
            check(&p, "h", 80, &private).unwrap_err().kind,
            "internal address"
        );
        assert!(check(&p, "h", 80, &mixed).is_err(), "all or nothing");
        assert!(check(&p, "h", 80, &[]).is_err());
        // Public-only does not look at ports.
        assert!(check(&p, "h", 6443, &pubs).is_ok());

        let e = AddressPlan::ExactHost;
        assert!(check(&e, "h", 80, &private).is_ok());
        let d = check(&e, "h", 80, &lo).unwrap_err();
        assert_eq!(d.kind, "declared endpoint check failed");
        assert!(
            d.detail.contains("always-blocked address 127.0.0.1"),
            "{d:?}"
        );
        let d = check(&e, "h", 6443, &private).unwrap_err();
        assert_eq!(d.detail, "port 6443 is a blocked control-plane port");

        let a = AddressPlan::AllowedIps(vec!["10.77.0.0/24".parse().unwrap()]);
        assert!(check(&a, "h", 9090, &private).is_ok());
        let d = check(&a, "h", 9090, &[ip("10.88.0.10")]).unwrap_err();
        assert_eq!(d.kind, "allowed_ips check failed");
        assert!(d.detail.contains("not in allowed_ips"), "{d:?}");
        for port in CONTROL_PLANE_PORTS {
            assert!(check(&a, "h", port, &private).is_err());
        }

        let l = AddressPlan::IpLiteral(ip("10.77.0.10"));
        assert!(check(&l, "10.77.0.10", 80, &private).is_ok());
        assert!(check(&l, "10.77.0.10", 80, &[ip("10.77.0.11")]).is_err());
    }
}
