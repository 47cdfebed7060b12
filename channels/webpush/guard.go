package webpush

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrEndpointNotAllowed is wrapped by the error Deliver returns (class
// invalid_recipient, permanent) when a subscription's endpoint is not an
// https URL of a public host: a push endpoint comes from a browser, so it is
// untrusted input and must not make the server call into its own network.
var ErrEndpointNotAllowed = errors.New("webpush: push endpoint not allowed (https and a public address required)")

// Special-purpose address blocks (IANA's IPv4 and IPv6 Special-Purpose
// Address Registries, RFC 6890 and its updates), plus multicast and the
// deprecated IPv6 site-local block: none of them is where a push service
// lives. The blocks marked "globally reachable" by IANA (AS112, AMT, the
// PCP and TURN anycast addresses) are refused too: no push service answers
// there either, and a refusal is only a dead-lettered subscription.
var (
	specialV4 = prefixes(
		"0.0.0.0/8",          // "this network" (RFC 791)
		"10.0.0.0/8",         // private (RFC 1918)
		"100.64.0.0/10",      // shared address space, CGNAT (RFC 6598)
		"127.0.0.0/8",        // loopback
		"169.254.0.0/16",     // link-local (cloud metadata services)
		"172.16.0.0/12",      // private (RFC 1918)
		"192.0.0.0/24",       // IETF protocol assignments (RFC 6890), incl. DS-Lite, PCP/TURN anycast, NAT64 discovery
		"192.0.2.0/24",       // documentation, TEST-NET-1 (RFC 5737)
		"192.31.196.0/24",    // AS112-v4 (RFC 7535)
		"192.52.193.0/24",    // AMT (RFC 7450)
		"192.88.99.0/24",     // deprecated 6to4 relay anycast (RFC 7526)
		"192.168.0.0/16",     // private (RFC 1918)
		"192.175.48.0/24",    // AS112 direct delegation (RFC 7534)
		"198.18.0.0/15",      // benchmarking (RFC 2544)
		"198.51.100.0/24",    // documentation, TEST-NET-2 (RFC 5737)
		"203.0.113.0/24",     // documentation, TEST-NET-3 (RFC 5737)
		"224.0.0.0/4",        // multicast
		"240.0.0.0/4",        // reserved (RFC 1112), incl. 255.255.255.255
		"255.255.255.255/32", // limited broadcast (RFC 919)
	)
	specialV6 = prefixes(
		"::/96",             // unspecified, loopback and the deprecated IPv4-compatible ::a.b.c.d (RFC 4291)
		"::ffff:0:0:0/96",   // IPv4-translated (RFC 2765)
		"64:ff9b:1::/48",    // local-use IPv4/IPv6 translation (RFC 8215)
		"100::/64",          // discard-only (RFC 6666)
		"100:0:0:1::/64",    // dummy IPv6 prefix
		"2001::/23",         // IETF protocol assignments, incl. Teredo, benchmarking, ORCHID (RFC 2928, 4380, 5180, 7343)
		"2001:db8::/32",     // documentation (RFC 3849)
		"2620:4f:8000::/48", // AS112 direct delegation (RFC 7534)
		"3fff::/20",         // documentation (RFC 9637)
		"5f00::/16",         // SRv6 SIDs (RFC 9602)
		"fc00::/7",          // unique local (RFC 4193)
		"fe80::/10",         // link-local
		"fec0::/10",         // deprecated site-local (RFC 3879)
		"ff00::/8",          // multicast
	)
	// globalV6 is IPv6 global unicast: an address outside it is reserved
	// or unassigned, never a push service's.
	globalV6 = netip.MustParsePrefix("2000::/3")
	// nat64 is the well-known NAT64 prefix (RFC 6052): the IPv4 address in
	// its last 32 bits is the one reached.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	// sixToFour is 6to4 (RFC 3056): 2002:AABB:CCDD::/48 is reached through
	// the IPv4 address AA.BB.CC.DD.
	sixToFour = netip.MustParsePrefix("2002::/16")
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func inAny(ip netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// publicAddr reports whether ip is an address a push service may have: a
// unicast address outside every special-purpose block. An IPv6 address
// that embeds an IPv4 address which it reaches (IPv4-mapped, NAT64's
// well-known prefix, 6to4) is judged by that IPv4 address; the
// IPv4-compatible form and local-use NAT64 prefixes are refused outright.
func publicAddr(ip netip.Addr) bool {
	if !ip.IsValid() {
		return false
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is4() {
		return !inAny(ip, specialV4)
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return publicAddr(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(ip):
		return publicAddr(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return globalV6.Contains(ip) && !inAny(ip, specialV6)
}

// lookupFunc resolves a host name to its addresses.
type lookupFunc func(ctx context.Context, network, host string) ([]netip.Addr, error)

// parseEndpoint parses a subscription endpoint and checks its shape: an
// absolute https URL with a host and no user info (http is accepted too when
// insecure is set).
func parseEndpoint(endpoint string, insecure bool) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || u.Hostname() == "" || u.User != nil {
		return nil, ErrEndpointNotAllowed
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
	case "http":
		if !insecure {
			return nil, ErrEndpointNotAllowed
		}
	default:
		return nil, ErrEndpointNotAllowed
	}
	return u, nil
}

// checkHost resolves host and fails with ErrEndpointNotAllowed unless every
// address it has is public. A resolution failure is returned as is (the
// caller classifies it as a network error).
func checkHost(ctx context.Context, lookup lookupFunc, host string) error {
	if ip, err := netip.ParseAddr(host); err == nil {
		if !publicAddr(ip) {
			return ErrEndpointNotAllowed
		}
		return nil
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return ErrEndpointNotAllowed
	}
	addrs, err := lookup(ctx, "ip", host)
	if err != nil {
		return err
	}
	if len(addrs) == 0 {
		return &net.DNSError{Err: "no addresses", IsNotFound: true}
	}
	for _, ip := range addrs {
		if !publicAddr(ip) {
			return ErrEndpointNotAllowed
		}
	}
	return nil
}

// guardedClient is the default HTTP client: it dials only public addresses
// (checked again at connect time, so a DNS answer that changes between the
// check and the dial cannot reach an internal address), follows no
// redirects, and uses no proxy (a proxy would hide the dialled address; pass
// Options.HTTPClient to use one).
func guardedClient() *http.Client {
	dialer := &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return ErrEndpointNotAllowed
			}
			ip, err := netip.ParseAddr(host)
			if err != nil || !publicAddr(ip) {
				return ErrEndpointNotAllowed
			}
			return nil
		},
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = dialer.DialContext
	return &http.Client{
		Transport:     tr,
		Timeout:       DefaultRequestTimeout,
		CheckRedirect: noRedirect,
	}
}

// noRedirect makes a client return a redirect response instead of following
// it (a push service does not redirect; following one could reach an
// internal address, or hand the VAPID authorization to another host). Every
// client the provider uses has it, a caller's included.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
