package webpush

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

// The guard refuses one address of every special-purpose block of IANA's
// IPv4 and IPv6 registries (and the forms that embed such an IPv4
// address), and passes public addresses, the blocks' neighbours included.
// Pure function tests: nothing is dialled.
func TestPublicAddr_SpecialPurposeRanges(t *testing.T) {
	refused := []struct{ addr, block string }{
		// IPv4.
		{"0.0.0.0", "0.0.0.0/8 this host"},
		{"0.1.2.3", "0.0.0.0/8 this network"},
		{"10.1.2.3", "10.0.0.0/8 private"},
		{"100.64.0.1", "100.64.0.0/10 shared (CGNAT)"},
		{"100.127.255.254", "100.64.0.0/10 shared, last"},
		{"127.0.0.1", "127.0.0.0/8 loopback"},
		{"127.255.0.9", "127.0.0.0/8 loopback"},
		{"169.254.169.254", "169.254.0.0/16 link-local (metadata)"},
		{"172.16.0.1", "172.16.0.0/12 private"},
		{"172.31.255.254", "172.16.0.0/12 private, last"},
		{"192.0.0.1", "192.0.0.0/24 IETF protocol assignments"},
		{"192.0.0.9", "192.0.0.9/32 PCP anycast"},
		{"192.0.0.170", "192.0.0.170/32 NAT64 discovery"},
		{"192.0.2.10", "192.0.2.0/24 TEST-NET-1"},
		{"192.31.196.1", "192.31.196.0/24 AS112-v4"},
		{"192.52.193.1", "192.52.193.0/24 AMT"},
		{"192.88.99.1", "192.88.99.0/24 6to4 relay anycast"},
		{"192.168.1.10", "192.168.0.0/16 private"},
		{"192.175.48.1", "192.175.48.0/24 AS112 direct delegation"},
		{"198.18.0.1", "198.18.0.0/15 benchmarking"},
		{"198.19.255.254", "198.18.0.0/15 benchmarking, last"},
		{"198.51.100.7", "198.51.100.0/24 TEST-NET-2"},
		{"203.0.113.7", "203.0.113.0/24 TEST-NET-3"},
		{"224.0.0.251", "224.0.0.0/4 multicast"},
		{"239.255.255.250", "224.0.0.0/4 multicast (SSDP)"},
		{"240.0.0.1", "240.0.0.0/4 reserved"},
		{"255.255.255.254", "240.0.0.0/4 reserved"},
		{"255.255.255.255", "limited broadcast"},
		// IPv6.
		{"::", "::/128 unspecified"},
		{"::1", "::1/128 loopback"},
		{"::ffff:127.0.0.1", "::ffff:0:0/96 IPv4-mapped loopback"},
		{"::ffff:10.0.0.7", "::ffff:0:0/96 IPv4-mapped private"},
		{"::ffff:169.254.169.254", "::ffff:0:0/96 IPv4-mapped link-local"},
		{"::ffff:0:8.8.8.8", "::ffff:0:0:0/96 IPv4-translated"},
		{"::8.8.8.8", "IPv4-compatible ::a.b.c.d (deprecated)"},
		{"::127.0.0.1", "IPv4-compatible loopback"},
		{"64:ff9b::127.0.0.1", "64:ff9b::/96 NAT64 of loopback"},
		{"64:ff9b::10.0.0.1", "64:ff9b::/96 NAT64 of private"},
		{"64:ff9b::169.254.169.254", "64:ff9b::/96 NAT64 of link-local"},
		{"64:ff9b:1::8.8.8.8", "64:ff9b:1::/48 local-use translation"},
		{"100::1", "100::/64 discard-only"},
		{"100:0:0:1::1", "100:0:0:1::/64 dummy prefix"},
		{"2001::1", "2001::/32 Teredo"},
		{"2001:2::1", "2001:2::/48 benchmarking"},
		{"2001:10::1", "2001:10::/28 ORCHID"},
		{"2001:20::1", "2001:20::/28 ORCHIDv2"},
		{"2001:1ff::1", "2001::/23 IETF protocol assignments, last /32"},
		{"2001:db8::1", "2001:db8::/32 documentation"},
		{"2002:7f00:1::1", "2002::/16 6to4 of loopback"},
		{"2002:c0a8:10a::1", "2002::/16 6to4 of private"},
		{"2002:a9fe:a9fe::1", "2002::/16 6to4 of link-local"},
		{"2620:4f:8000::1", "2620:4f:8000::/48 AS112 direct delegation"},
		{"3fff::1", "3fff::/20 documentation"},
		{"5f00::1", "5f00::/16 SRv6 SIDs"},
		{"fc00::1", "fc00::/7 unique local"},
		{"fd12:3456:789a::1", "fc00::/7 unique local"},
		{"fe80::1", "fe80::/10 link-local"},
		{"fe80::1%eth0", "fe80::/10 link-local with a zone"},
		{"fec0::1", "fec0::/10 site-local (deprecated)"},
		{"ff02::1", "ff00::/8 multicast"},
		{"ff0e::1", "ff00::/8 global multicast"},
		{"4000::1", "outside 2000::/3 global unicast (unassigned)"},
		{"e000::1", "outside 2000::/3 global unicast (unassigned)"},
	}
	for _, tc := range refused {
		if publicAddr(netip.MustParseAddr(tc.addr)) {
			t.Errorf("publicAddr(%s) = true, want false (%s)", tc.addr, tc.block)
		}
	}
	public := []string{
		"8.8.8.8", "1.1.1.1", "142.250.74.106", "17.253.144.10",
		// Neighbours of the special blocks.
		"9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0",
		"126.255.255.255", "128.0.0.0", "169.253.255.255", "169.255.0.0",
		"172.15.255.255", "172.32.0.0", "191.255.255.255", "192.0.1.1",
		"192.0.3.1", "192.88.98.255", "192.88.100.0", "192.167.255.255",
		"192.169.0.0", "198.17.255.255", "198.20.0.0", "198.51.99.255",
		"198.51.101.0", "203.0.112.255", "203.0.114.0", "223.255.255.255",
		// IPv6 global unicast, and the forms that reach a public IPv4.
		"2a00:1450:4001:82b::200a", "2606:4700:4700::1111", "2001:200::1",
		"2001:db7:ffff::1", "2001:db9::1", "2003::1", "3ffe::1",
		"::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1",
	}
	for _, a := range public {
		if !publicAddr(netip.MustParseAddr(a)) {
			t.Errorf("publicAddr(%s) = false, want true", a)
		}
	}
	if publicAddr(netip.Addr{}) {
		t.Error("publicAddr(invalid) = true")
	}
}

// checkHost applies the same rule to an endpoint whose host is an address
// literal, and to every address a name resolves to.
func TestCheckHost_SpecialPurposeLiteralsAndNames(t *testing.T) {
	lookup := func(_ context.Context, _, host string) ([]netip.Addr, error) {
		switch host {
		case "bench.example":
			return []netip.Addr{netip.MustParseAddr("142.250.74.106"), netip.MustParseAddr("198.18.0.1")}, nil
		case "nat64.example":
			return []netip.Addr{netip.MustParseAddr("64:ff9b::a9fe:a9fe")}, nil
		case "push.example":
			return []netip.Addr{netip.MustParseAddr("142.250.74.106"), netip.MustParseAddr("2a00:1450:4001:82b::200a")}, nil
		}
		return nil, errors.New("no such host")
	}
	for host, ok := range map[string]bool{
		"192.0.2.1": false, "240.0.0.1": false, "2001:db8::1": false, "64:ff9b::7f00:1": false,
		"::ffff:192.168.0.1": false, "bench.example": false, "nat64.example": false,
		"8.8.8.8": true, "push.example": true,
	} {
		err := checkHost(context.Background(), lookup, host)
		if ok != (err == nil) || (!ok && !errors.Is(err, ErrEndpointNotAllowed)) {
			t.Errorf("checkHost(%s) = %v, want allowed %v", host, err, ok)
		}
	}
}
