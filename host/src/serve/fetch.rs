//! Remote image URLs, fetched only when the server runs with `--allow-remote-images`.
//!
//! A URL the server fetches on a client's behalf can reach what the client cannot (the
//! server's own network), so every hop is checked: http(s) only; the host's addresses must all
//! be public (no loopback, private, link-local, shared, multicast or reserved ranges), checked
//! on the addresses the connection then uses (the resolver below is the client's only
//! resolver, so a second lookup cannot swap them); a redirect is a new hop, checked the same
//! way, at most `MAX_REDIRECTS` of them; the body is capped in bytes and the whole fetch in time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{Client, Url, redirect};

/// Redirects followed per fetch.
const MAX_REDIRECTS: usize = 3;

/// Why a remote image was not fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("`{0}` is not a valid URL")]
    Url(String),
    #[error("only http and https image URLs are fetched, not `{0}`")]
    Scheme(String),
    #[error("{host} is not a public address ({address}); this server fetches images from public hosts only")]
    NotPublic { host: String, address: IpAddr },
    #[error("the image at {url} is larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("fetching {url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("fetching {url} took longer than {seconds} s")]
    Timeout { url: String, seconds: u64 },
    #[error("fetching {url} failed: {reason}")]
    Failed { url: String, reason: String },
}

/// Fetches remote images under the policy above.
#[derive(Debug)]
pub(crate) struct RemoteImages {
    client: Client,
    max_bytes: u64,
    timeout: Duration,
    allow_private: bool,
}

impl RemoteImages {
    /// `allow_private` lifts the address check (for images on the server's own network; never
    /// for a server reachable by untrusted clients).
    pub(crate) fn new(max_bytes: u64, timeout: Duration, allow_private: bool) -> Result<Self, FetchError> {
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match check_url(attempt.url(), allow_private) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e.to_string()),
            }
        });
        let client = Client::builder()
            .redirect(policy)
            .dns_resolver(Arc::new(PublicResolver { allow_private }))
            .timeout(timeout)
            .connect_timeout(timeout)
            .no_proxy()
            .user_agent(concat!("mlxcel-host/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Failed { url: String::new(), reason: e.to_string() })?;
        Ok(RemoteImages { client, max_bytes, timeout, allow_private })
    }

    /// The bytes at `url`, or why not.
    pub(crate) async fn fetch(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let parsed = Url::parse(url).map_err(|_| FetchError::Url(url.to_owned()))?;
        check_url(&parsed, self.allow_private)?;
        let failed = |e: reqwest::Error| self.classify(url, e);
        let mut response = self.client.get(parsed).send().await.map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status { url: url.to_owned(), status: status.as_u16() });
        }
        let too_large = || FetchError::TooLarge { url: url.to_owned(), limit: self.max_bytes };
        if response.content_length().is_some_and(|n| n > self.max_bytes) {
            return Err(too_large());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if (bytes.len() + chunk.len()) as u64 > self.max_bytes {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    fn classify(&self, url: &str, e: reqwest::Error) -> FetchError {
        if e.is_timeout() {
            return FetchError::Timeout { url: url.to_owned(), seconds: self.timeout.as_secs() };
        }
        // The redirect policy's and the resolver's refusals come back as the error's source.
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            reason = s.to_string();
            source = s.source();
        }
        FetchError::Failed { url: url.to_owned(), reason }
    }
}

/// A hop's URL: http(s), and an address literal must be public.
fn check_url(url: &Url, allow_private: bool) -> Result<(), FetchError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FetchError::Scheme(url.scheme().to_owned()));
    }
    let literal = match url.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        Some(url::Host::Domain(_)) => None,
        None => return Err(FetchError::Url(url.to_string())),
    };
    match literal {
        Some(address) if !allow_private && !is_public(address) => {
            Err(FetchError::NotPublic { host: url.host_str().unwrap_or_default().to_owned(), address })
        }
        _ => Ok(()),
    }
}

/// The client's resolver: a name resolves only if every address it has is public.
#[derive(Debug)]
struct PublicResolver {
    allow_private: bool,
}

impl Resolve for PublicResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allow_private && let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
                let refusal = FetchError::NotPublic { host, address: bad.ip() };
                return Err(Box::new(refusal) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// Whether an address is globally routable: not loopback, private, link-local, shared (CGNAT),
/// documentation, benchmarking, multicast, broadcast, unspecified or reserved; IPv6 addresses
/// that embed an IPv4 address are judged by it.
pub(crate) fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            // 64:ff9b::/96, NAT64 of an IPv4 address.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a, b, c, d));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site local (deprecated) fec0::/10
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || s[..6] == [0, 0, 0, 0, 0, 0]) // ::/96: IPv4-compatible (deprecated), ::1, ::
        }
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(v4.is_private()
        || v4.is_loopback()
        || v4.is_link_local()
        || v4.is_broadcast()
        || v4.is_documentation()
        || v4.is_unspecified()
        || v4.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
        || a >= 240) // reserved 240/4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn only_globally_routable_addresses_are_public() {
        for public in ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            assert!(is_public(ip(public)), "{public}");
        }
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.2.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "::127.0.0.1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
    }

    #[test]
    fn urls_are_checked_for_scheme_and_address_literals() {
        let check = |u: &str, allow| check_url(&Url::parse(u).expect("url"), allow);
        assert!(check("https://example.com/a.png", false).is_ok());
        assert!(check("http://8.8.8.8/a.png", false).is_ok());
        assert!(matches!(check("ftp://example.com/a.png", false), Err(FetchError::Scheme(_))));
        assert!(matches!(check("file:///etc/passwd", false), Err(FetchError::Scheme(_))));
        assert!(matches!(check("http://127.0.0.1:8000/a.png", false), Err(FetchError::NotPublic { .. })));
        assert!(matches!(check("http://[::1]/a.png", false), Err(FetchError::NotPublic { .. })));
        assert!(matches!(check("http://169.254.169.254/latest", false), Err(FetchError::NotPublic { .. })));
        // Decimal and hex address forms are parsed to the same address first.
        assert!(matches!(check("http://2130706433/", false), Err(FetchError::NotPublic { .. })));
        assert!(matches!(check("http://0x7f.1/", false), Err(FetchError::NotPublic { .. })));
        assert!(check("http://127.0.0.1/a.png", true).is_ok());
    }
}
