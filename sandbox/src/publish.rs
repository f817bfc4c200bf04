//! `--publish` specs: which host address and port forward to which guest port.
//!
//! Accepted forms (TCP only; the forward runs over vsock, a stream transport):
//!
//! | written                 | means                          |
//! |-------------------------|--------------------------------|
//! | `8000`                  | `127.0.0.1:8000` -> guest 8000 |
//! | `9000:8000`             | `127.0.0.1:9000` -> guest 8000 |
//! | `0:8000`                | a free loopback port -> 8000   |
//! | `IP:9000:8000`          | `IP:9000` -> guest 8000        |
//! | `[::1]:9000:8000`       | `[::1]:9000` -> guest 8000     |
//! | any of the above `/tcp` | the same                       |
//!
//! Ranges, as docker writes them, publish one mapping per port ([`PublishSpec::expand`],
//! [`PublishSpec::parse_all`]): `8000-8003:8000-8003` (equal lengths), `8000-8003` (the same
//! ports on both sides), `IP:8000-8003:9000-9003`, and `0:8000-8003` (a free host port for
//! each guest port). At most [`MAX_RANGE`] ports per spec.
//!
//! Loopback is the default; a non-loopback address such as `0.0.0.0` is used only when it is
//! written out. UDP, a guest port 0 and a host range without a guest range of the same
//! length are refused.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The most ports one range may publish.
pub const MAX_RANGE: usize = 1024;

/// A normalized publish spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublishSpec {
    pub host_ip: IpAddr,
    /// 0 picks a free port when the listener is bound.
    pub host_port: u16,
    pub guest_port: u16,
}

/// Why a publish spec was refused; each names the spec as written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PublishError {
    #[error("publish {spec:?}: empty")]
    Empty { spec: String },
    #[error("publish {spec:?}: {part:?} is not a port (0-65535)")]
    BadPort { spec: String, part: String },
    #[error("publish {spec:?}: the guest port must not be 0")]
    GuestPortZero { spec: String },
    #[error("publish {spec:?}: {part:?} is not an IP address")]
    BadAddress { spec: String, part: String },
    #[error("publish {spec:?}: protocol {proto:?} is not supported (tcp only)")]
    Protocol { spec: String, proto: String },
    #[error("publish {spec:?}: {why}")]
    Range { spec: String, why: &'static str },
    #[error("publish {spec:?}: expected PORT, HOST:GUEST or IP:HOST:GUEST")]
    Form { spec: String },
    #[error("publish {spec:?}: host address {addr} is published twice")]
    Duplicate { spec: String, addr: SocketAddr },
}

impl PublishSpec {
    /// Loopback `host_port` forwarding to `guest_port`.
    pub fn loopback(host_port: u16, guest_port: u16) -> Self {
        PublishSpec {
            host_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            host_port,
            guest_port,
        }
    }

    /// The host address to bind.
    pub fn host_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host_ip, self.host_port)
    }

    /// Parse one spec that publishes exactly one port (see the module docs for the forms);
    /// a range is refused here: [`PublishSpec::expand`] takes it.
    pub fn parse(spec: &str) -> Result<Self, PublishError> {
        match PublishSpec::expand(spec)?.as_slice() {
            [one] => Ok(*one),
            _ => Err(PublishError::Range {
                spec: spec.into(),
                why: "a range publishes several ports (use parse_all)",
            }),
        }
    }

    /// Parse one spec, a range giving one mapping per port, in port order.
    pub fn expand(spec: &str) -> Result<Vec<Self>, PublishError> {
        let err_spec = || spec.to_string();
        let body = match spec.rsplit_once('/') {
            Some((body, proto)) if proto.eq_ignore_ascii_case("tcp") => body,
            Some((_, proto)) => {
                return Err(PublishError::Protocol {
                    spec: err_spec(),
                    proto: proto.into(),
                });
            }
            None => spec,
        };
        if body.trim().is_empty() {
            return Err(PublishError::Empty { spec: err_spec() });
        }
        let (ip, ports) = split_address(spec, body)?;
        let parts: Vec<&str> = ports.split(':').collect();
        let (host, guest) = match (ip.is_some(), parts.as_slice()) {
            (false, [p]) => (range(spec, p)?, range(spec, p)?),
            (_, [h, g]) => (range(spec, h)?, range(spec, g)?),
            _ => return Err(PublishError::Form { spec: err_spec() }),
        };
        if guest.0 == 0 {
            return Err(PublishError::GuestPortZero { spec: err_spec() });
        }
        let count = usize::from(guest.1 - guest.0) + 1;
        let any_host = host == (0, 0);
        if !any_host && usize::from(host.1 - host.0) + 1 != count {
            return Err(PublishError::Range {
                spec: err_spec(),
                why: "the host and guest ranges differ in length",
            });
        }
        if count > MAX_RANGE {
            return Err(PublishError::Range {
                spec: err_spec(),
                why: "a range may publish at most 1024 ports",
            });
        }
        let host_ip = ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        Ok((0..count)
            .map(|i| {
                let i = i as u16; // count <= MAX_RANGE
                PublishSpec {
                    host_ip,
                    host_port: if any_host { 0 } else { host.0 + i },
                    guest_port: guest.0 + i,
                }
            })
            .collect())
    }

    /// Parse several specs (ranges expanded), refusing the same non-zero host address twice.
    pub fn parse_all<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Self>, PublishError> {
        let mut out: Vec<PublishSpec> = Vec::with_capacity(specs.len());
        for s in specs {
            for p in PublishSpec::expand(s.as_ref())? {
                let clash = out
                    .iter()
                    .any(|o| o.host_port != 0 && o.host_addr() == p.host_addr());
                if clash {
                    return Err(PublishError::Duplicate {
                        spec: s.as_ref().to_string(),
                        addr: p.host_addr(),
                    });
                }
                out.push(p);
            }
        }
        Ok(out)
    }
}

/// A port (`8000`) or an inclusive range (`8000-8003`), as `(first, last)`.
fn range(spec: &str, part: &str) -> Result<(u16, u16), PublishError> {
    let port = |p: &str| {
        p.parse::<u16>().map_err(|_| PublishError::BadPort {
            spec: spec.into(),
            part: p.into(),
        })
    };
    let Some((a, b)) = part.split_once('-') else {
        let p = port(part)?;
        return Ok((p, p));
    };
    let (a, b) = (port(a)?, port(b)?);
    if a == 0 || b < a {
        return Err(PublishError::Range {
            spec: spec.into(),
            why: "a range is FIRST-LAST with 0 < FIRST <= LAST",
        });
    }
    Ok((a, b))
}

/// Split an optional leading IP (`1.2.3.4:` or `[v6]:`) from the port part. An IP is
/// present only in the three-field form.
fn split_address<'a>(spec: &str, body: &'a str) -> Result<(Option<IpAddr>, &'a str), PublishError> {
    let bad = |part: &str| PublishError::BadAddress {
        spec: spec.into(),
        part: part.into(),
    };
    if let Some(rest) = body.strip_prefix('[') {
        let (addr, ports) = rest.split_once("]:").ok_or_else(|| bad(body))?;
        let ip: std::net::Ipv6Addr = addr.parse().map_err(|_| bad(addr))?;
        return Ok((Some(IpAddr::V6(ip)), ports));
    }
    let fields = body.split(':').count();
    if fields == 3 {
        let (addr, ports) = body.split_once(':').ok_or_else(|| bad(body))?;
        let ip: Ipv4Addr = addr.parse().map_err(|_| bad(addr))?;
        return Ok((Some(IpAddr::V4(ip)), ports));
    }
    Ok((None, body))
}

impl FromStr for PublishSpec {
    type Err = PublishError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PublishSpec::parse(s)
    }
}

impl fmt::Display for PublishSpec {
    /// The fully qualified form, `IP:HOST:GUEST` (`[v6]:HOST:GUEST`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host_ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}:{}", self.host_port, self.guest_port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}:{}", self.host_port, self.guest_port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ok = [
            ("8000", "127.0.0.1:8000:8000"),
            ("9000:8000", "127.0.0.1:9000:8000"),
            ("0:8000", "127.0.0.1:0:8000"),
            ("127.0.0.1:9000:8000", "127.0.0.1:9000:8000"),
            ("0.0.0.0:3000:3000", "0.0.0.0:3000:3000"),
            ("[::1]:8080:3000", "[::1]:8080:3000"),
            ("3000/tcp", "127.0.0.1:3000:3000"),
            ("10.0.0.2:1:65535/TCP", "10.0.0.2:1:65535"),
        ];
        for (input, want) in ok {
            let got = PublishSpec::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got.to_string(), want, "{input}");
            assert_eq!(
                PublishSpec::parse(want).unwrap(),
                got,
                "round trip of {want}"
            );
        }
        let bad = [
            ("", "empty"),
            ("/tcp", "empty"),
            ("abc", "not a port"),
            ("70000", "not a port"),
            ("9000:", "not a port"),
            ("8000:0", "guest port"),
            ("0", "guest port"),
            ("3000/udp", "udp"),
            ("8000-8003:9000-9001", "differ in length"),
            ("8003-8000", "FIRST-LAST"),
            ("0-3:1-4", "FIRST-LAST"),
            ("8000-8001", "several ports"),
            ("1-2000", "at most 1024"),
            ("9000-9003:80", "differ in length"),
            ("1:2:3:4", "expected"),
            ("999.1.1.1:80:80", "not an IP"),
            ("host:80:80", "not an IP"),
            ("[::1:80:80", "not an IP"),
            ("[zz]:80:80", "not an IP"),
            ("[::1]:80", "expected"),
        ];
        for (input, want) in bad {
            let err = PublishSpec::parse(input).expect_err(input).to_string();
            assert!(
                err.contains(want) && err.contains(&format!("{input:?}")),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn only_written_addresses_leave_loopback() {
        assert!(PublishSpec::parse("8000").unwrap().host_ip.is_loopback());
        assert!(PublishSpec::parse("1:2").unwrap().host_ip.is_loopback());
        assert!(
            PublishSpec::parse("0.0.0.0:1:2")
                .unwrap()
                .host_ip
                .is_unspecified()
        );
    }

    #[test]
    fn ranges_expand_in_port_order() {
        let all = |specs: &[&str]| -> Vec<String> {
            PublishSpec::parse_all(specs)
                .unwrap_or_else(|e| panic!("{specs:?}: {e}"))
                .iter()
                .map(|p| p.to_string())
                .collect()
        };
        assert_eq!(
            all(&["8000-8002:9000-9002"]),
            [
                "127.0.0.1:8000:9000",
                "127.0.0.1:8001:9001",
                "127.0.0.1:8002:9002"
            ]
        );
        assert_eq!(
            all(&["8000-8001"]),
            ["127.0.0.1:8000:8000", "127.0.0.1:8001:8001"]
        );
        assert_eq!(
            all(&["0:8000-8001"]),
            ["127.0.0.1:0:8000", "127.0.0.1:0:8001"]
        );
        assert_eq!(
            all(&["127.0.0.2:5-6:7-8", "[::1]:1-2:3-4/tcp"]),
            ["127.0.0.2:5:7", "127.0.0.2:6:8", "[::1]:1:3", "[::1]:2:4"]
        );
        assert_eq!(PublishSpec::expand("1-1024").unwrap().len(), MAX_RANGE);
        let err = PublishSpec::parse_all(&["8000-8002", "8001"]).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    #[test]
    fn duplicates_refused() {
        let err = PublishSpec::parse_all(&["8000", "8000:9000"]).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
        assert_eq!(PublishSpec::parse_all(&["0:80", "0:81"]).unwrap().len(), 2);
        assert_eq!(
            PublishSpec::parse_all(&["1:80", "0.0.0.0:1:80"])
                .unwrap()
                .len(),
            2
        );
    }
}
