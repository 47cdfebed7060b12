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

// cgnat is the shared address space of RFC 6598, not public either.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// publicAddr reports whether ip is an address a push service may have:
// not loopback, private, link-local, multicast, unspecified or shared.
func publicAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid(),
		ip.IsLoopback(),
		ip.IsPrivate(),
		ip.IsLinkLocalUnicast(),
		ip.IsLinkLocalMulticast(),
		ip.IsInterfaceLocalMulticast(),
		ip.IsMulticast(),
		ip.IsUnspecified(),
		cgnat.Contains(ip):
		return false
	}
	return true
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
// internal address).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
