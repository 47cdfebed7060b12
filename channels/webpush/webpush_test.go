package webpush

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKey = envelope.Key{Tenant: "t1", EnvelopeID: "env-1", Segment: 0}

func TestProvider_Deliver_RequestShape(t *testing.T) {
	for _, rs := range []int{0, 3070, MaxRecordSize} {
		t.Run("RecordSize"+strconv.Itoa(rs), func(t *testing.T) {
			ps := newPushService(t, nil)
			keys := mustKeys(t)
			// A subscriber given with its mailto: must not be doubled.
			p := mustProvider(t, ps, Options{VAPIDPublicKey: keys.Public, VAPIDPrivateKey: keys.Private,
				Subscriber: "mailto:ops@example.com", RecordSize: rs})
			payload := []byte(`{"title":"Your week","body":"3 highlights","url":"https://app.example/d/1","tag":"digest"}`)
			msg := pushMessage(ps.subscription("/wpush/v2/abc"), payload, 90*time.Second, envelope.UrgencyLow, "digest-u42")

			rc, err := p.Deliver(context.Background(), testKey, msg)
			if err != nil {
				t.Fatalf("Deliver: %v", err)
			}
			reqs := ps.requests()
			if len(reqs) != 1 {
				t.Fatalf("push service saw %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.DecodeErr != nil {
				t.Fatalf("push service could not read the request: %v", r.DecodeErr)
			}
			wantRS := rs
			if wantRS == 0 {
				wantRS = DefaultRecordSize
			}
			if r.BodyLen != wantRS || int(r.RS) != wantRS {
				t.Errorf("body length %d, record size %d; want both %d", r.BodyLen, r.RS, wantRS)
			}
			if !bytes.Equal(r.Plaintext, payload) {
				t.Errorf("decrypted payload = %q, want %q", r.Plaintext, payload)
			}
			for name, want := range map[string]string{
				"TTL":              "90",
				"Topic":            "digest-u42",
				"Urgency":          "low",
				"Content-Encoding": "aes128gcm",
				"Content-Type":     "application/octet-stream",
			} {
				if got := r.Header.Get(name); got != want {
					t.Errorf("header %s = %q, want %q", name, got, want)
				}
			}
			if !strings.HasPrefix(r.Header.Get("Authorization"), "vapid t=") || !strings.Contains(r.Header.Get("Authorization"), ", k=") {
				t.Errorf("Authorization = %q, want the RFC 8292 form %q", r.Header.Get("Authorization"), "vapid t=…, k=…")
			}
			if r.VAPIDKey != keys.Public {
				t.Errorf("Authorization k= is not the VAPID public key")
			}
			if got := r.Claims["sub"]; got != "mailto:ops@example.com" {
				t.Errorf("JWT sub = %v, want mailto:ops@example.com (one mailto: prefix)", got)
			}
			if got := r.Claims["aud"]; got != ps.srv.URL {
				t.Errorf("JWT aud = %v, want the endpoint's origin %s", got, ps.srv.URL)
			}
			exp, _ := r.Claims["exp"].(float64)
			if d := time.Until(time.Unix(int64(exp), 0)); d <= 0 || d > 24*time.Hour {
				t.Errorf("JWT exp is %s from now, want within (0, 24h] (RFC 8292)", d)
			}
			loc := "https://push.example/m/wpush/v2/abc"
			if rc.ID != receiptID(loc, testKey) || strings.Contains(rc.ID, "wpush") {
				t.Errorf("receipt = %q, want the opaque hash of the Location", rc.ID)
			}
		})
	}
}

func TestProvider_Deliver_Defaults(t *testing.T) {
	ps := newPushService(t, nil)
	p := mustProvider(t, ps, Options{})
	msg := pushMessage(ps.subscription("/sub"), []byte(`{"title":"x"}`), 0, "", "")
	if _, err := p.Deliver(context.Background(), testKey, msg); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	h := ps.requests()[0].Header
	if got, want := h.Get("TTL"), strconv.Itoa(int(DefaultTTL/time.Second)); got != want {
		t.Errorf("TTL = %q, want the default %s (never 0)", got, want)
	}
	if got, want := h.Get("Topic"), testKey.Hash()[:32]; got != want {
		t.Errorf("Topic = %q, want %q (derived from the key, so a redelivery replaces)", got, want)
	}
	if got := h.Get("Urgency"); got != "" {
		t.Errorf("Urgency = %q, want none", got)
	}
}

func TestTTLSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want int
	}{
		{0, 2419200},
		{-time.Second, 2419200},
		{time.Millisecond, 1},
		{1200 * time.Millisecond, 2},
		{90 * time.Second, 90},
		{7 * 24 * time.Hour, 604800},
	} {
		if got := ttlSeconds(tc.in); got != tc.want {
			t.Errorf("ttlSeconds(%s) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestProvider_Deliver_Status(t *testing.T) {
	httpDate := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		wantErr    bool
		kind       envelope.Kind
		class      envelope.ErrorClass
		retryAtMin time.Duration
		retryAtMax time.Duration
	}{
		{name: "Created", status: 201},
		{name: "Accepted202", status: 202},
		{name: "NotFound", status: 404, body: `{"errno":102}`, wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassSubscriptionGone},
		{name: "Gone", status: 410, body: `{"code":410,"errno":106,"error":"Gone"}`, wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassSubscriptionGone},
		{name: "TooLarge", status: 413, body: "Request Entity Too Large: limited to 3070 bytes", wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassPayloadTooLarge},
		{name: "RateLimitedSeconds", status: 429, header: map[string]string{"Retry-After": "7"}, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassRateLimited, retryAtMin: 7 * time.Second, retryAtMax: 7 * time.Second},
		{name: "RateLimitedDate", status: 429, header: map[string]string{"Retry-After": httpDate}, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassRateLimited, retryAtMin: 110 * time.Second, retryAtMax: 121 * time.Second},
		{name: "RateLimitedNoHeader", status: 429, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassRateLimited},
		{name: "BadRequest", status: 400, body: `{"reason":"BadTopic"}`, wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
		{name: "Unauthorized", status: 401, wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassAuthFailed},
		{name: "ForbiddenBadJwt", status: 403, body: `{"reason":"BadJwtToken"}`, wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassAuthFailed},
		{name: "Teapot", status: 418, wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
		{name: "InternalError", status: 500, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable},
		{name: "Unavailable", status: 503, header: map[string]string{"Retry-After": "30"}, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable, retryAtMin: 30 * time.Second, retryAtMax: 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPushService(t, answer(tc.status, tc.header, tc.body))
			p := mustProvider(t, ps, Options{})
			rc, err := p.Deliver(context.Background(), testKey, pushMessage(ps.subscription("/s"), []byte("hi"), time.Hour, "", ""))
			if !tc.wantErr {
				if err != nil || rc.ID == "" {
					t.Fatalf("Deliver = %+v, %v; want a receipt", rc, err)
				}
				return
			}
			var de *envelope.DeliveryError
			if !errors.As(err, &de) {
				t.Fatalf("Deliver error = %v (%T), want *envelope.DeliveryError", err, err)
			}
			if de.Kind != tc.kind || de.Class != tc.class {
				t.Errorf("got %s/%s, want %s/%s", de.Kind, de.Class, tc.kind, tc.class)
			}
			if de.RetryAfter < tc.retryAtMin || de.RetryAfter > tc.retryAtMax {
				t.Errorf("RetryAfter = %s, want in [%s, %s]", de.RetryAfter, tc.retryAtMin, tc.retryAtMax)
			}
			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != tc.status {
				t.Errorf("cause = %v, want StatusError{%d}", de.Err, tc.status)
			}
			if tc.body != "" && strings.Contains(err.Error(), tc.body) {
				t.Errorf("error text %q contains the service's answer", err)
			}
			if rc != (channels.Receipt{}) {
				t.Errorf("receipt %+v returned with an error", rc)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-3", 0},
		{"120", 2 * time.Minute},
		{" 5 ", 5 * time.Second},
		{"soon", 0},
		{"Sun, 01 Mar 2026 12:01:30 GMT", 90 * time.Second},
		{"Sunday, 01-Mar-26 12:00:10 GMT", 10 * time.Second},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0},
		{"99999999999", maxRetryAfter},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// trackingBody records how much of it was read and whether it was closed.
type trackingBody struct {
	r      io.Reader
	read   atomic.Int64
	closed atomic.Bool
}

func (b *trackingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *trackingBody) Close() error { b.closed.Store(true); return nil }

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestProvider_Deliver_DrainsAndClosesBody(t *testing.T) {
	for _, status := range []int{201, 410, 500} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			body := &trackingBody{r: bytes.NewReader(make([]byte, 4<<20))}
			client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: status, Header: http.Header{}, Body: body, Request: r}, nil
			})}
			ps := newPushService(t, nil) // only for a valid subscription
			p := mustProvider(t, ps, Options{HTTPClient: client})
			_, _ = p.Deliver(context.Background(), testKey, pushMessage(ps.subscription("/s"), []byte("x"), time.Hour, "", ""))
			if !body.closed.Load() {
				t.Errorf("response body not closed")
			}
			if n := body.read.Load(); n == 0 || n > drainLimit {
				t.Errorf("read %d bytes of the body, want a bounded drain (0 < n ≤ %d)", n, drainLimit)
			}
		})
	}
}

func TestProvider_Deliver_PayloadTooLarge(t *testing.T) {
	for _, rs := range []int{0, 3070} {
		t.Run("RecordSize"+strconv.Itoa(rs), func(t *testing.T) {
			ps := newPushService(t, nil)
			p := mustProvider(t, ps, Options{RecordSize: rs})
			size := p.recordSize - RecordOverhead
			fits := bytes.Repeat([]byte("a"), size)
			if _, err := p.Deliver(context.Background(), testKey, pushMessage(ps.subscription("/s"), fits, time.Hour, "", "")); err != nil {
				t.Fatalf("a payload of exactly RecordSize-103 = %d bytes: %v, want sent", size, err)
			}
			if got := ps.requests()[0].Plaintext; !bytes.Equal(got, fits) {
				t.Errorf("largest payload not received intact (%d bytes)", len(got))
			}
			_, err := p.Deliver(context.Background(), testKey, pushMessage(ps.subscription("/s"), append(fits, 'b'), time.Hour, "", ""))
			de := envelope.Classify(err)
			if de == nil || de.Kind != envelope.KindPermanent || de.Class != envelope.ClassPayloadTooLarge {
				t.Fatalf("one byte more: %v, want permanent payload_too_large", err)
			}
			if n := len(ps.requests()); n != 1 {
				t.Errorf("push service saw %d requests, want 1: an oversize payload must fail before any network call", n)
			}
		})
	}
}

// TestProvider_Deliver_DoesNotWriteCallerBuffer pins the copy made for
// webpush-go v1.4.0, which pads into the message slice's spare capacity.
func TestProvider_Deliver_DoesNotWriteCallerBuffer(t *testing.T) {
	ps := newPushService(t, nil)
	p := mustProvider(t, ps, Options{})
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = 0xAA
	}
	payload := buf[:20]
	copy(payload, `{"title":"shared"}  `)
	before := append([]byte(nil), buf...)
	for range 3 {
		if _, err := p.Deliver(context.Background(), testKey, pushMessage(ps.subscription("/s"), payload, time.Hour, "", "")); err != nil {
			t.Fatalf("Deliver: %v", err)
		}
	}
	if !bytes.Equal(buf, before) {
		t.Errorf("Deliver wrote into the caller's payload buffer beyond its length")
	}
}

func TestProvider_Deliver_InvalidMessage(t *testing.T) {
	ps := newPushService(t, nil)
	p := mustProvider(t, ps, Options{})
	good := ps.subscription("/s")
	badKeys := good
	badKeys.Keys.P256dh = "bm90IGEga2V5"
	shortAuth := good
	shortAuth.Keys.Auth = "c2hvcnQ"
	noEndpoint := good
	noEndpoint.Endpoint = ""
	ftp := good
	ftp.Endpoint = "ftp://push.example/x"
	for _, tc := range []struct {
		name  string
		msg   *envelope.Message
		class envelope.ErrorClass
	}{
		{"NilMessage", nil, envelope.ClassInvalidRequest},
		{"NotPush", &envelope.Message{Channel: envelope.ChannelTelegram, Chat: &envelope.ChatMessage{ChatID: "1", Text: "x"}}, envelope.ClassInvalidRequest},
		{"BadP256dh", pushMessage(badKeys, []byte("x"), time.Hour, "", ""), envelope.ClassInvalidRecipient},
		{"ShortAuth", pushMessage(shortAuth, []byte("x"), time.Hour, "", ""), envelope.ClassInvalidRecipient},
		{"NoEndpoint", pushMessage(noEndpoint, []byte("x"), time.Hour, "", ""), envelope.ClassInvalidRecipient},
		{"NotHTTP", pushMessage(ftp, []byte("x"), time.Hour, "", ""), envelope.ClassInvalidRecipient},
		{"TopicTooLong", pushMessage(good, []byte("x"), time.Hour, "", strings.Repeat("a", 33)), envelope.ClassInvalidRequest},
		{"TopicBadChars", pushMessage(good, []byte("x"), time.Hour, "", "a/b"), envelope.ClassInvalidRequest},
		{"BadUrgency", pushMessage(good, []byte("x"), time.Hour, "urgent", ""), envelope.ClassInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Deliver(context.Background(), testKey, tc.msg)
			de := envelope.Classify(err)
			if de == nil || de.Kind != envelope.KindPermanent || de.Class != tc.class {
				t.Errorf("Deliver = %v, want permanent %s", err, tc.class)
			}
		})
	}
	if n := len(ps.requests()); n != 0 {
		t.Errorf("push service saw %d requests, want none for invalid messages", n)
	}
}

func TestProvider_Deliver_EndpointGuard(t *testing.T) {
	ok201 := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 201, Header: http.Header{"Location": {"https://push.example/m/1"}}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})}
	dns := map[string][]string{
		"fcm.googleapis.com":     {"142.250.74.106", "2a00:1450:4001:82b::200a"},
		"push.internal.example":  {"10.0.0.7"},
		"mixed.example":          {"142.250.74.106", "192.168.1.10"},
		"rebind.example":         {"::ffff:127.0.0.1"},
		"metadata.cloud.example": {"169.254.169.254"},
		"cgnat.example":          {"100.64.1.1"},
	}
	lookup := func(_ context.Context, _, host string) ([]netip.Addr, error) {
		ips, ok := dns[host]
		if !ok {
			return nil, errors.New("lookup " + host + ": no such host")
		}
		var out []netip.Addr
		for _, s := range ips {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}
	ps := newPushService(t, nil)
	sub := ps.subscription("/s")
	for _, tc := range []struct {
		endpoint string
		wantErr  bool
		kind     envelope.Kind
		class    envelope.ErrorClass
	}{
		{"https://fcm.googleapis.com/fcm/send/abc", false, 0, ""},
		{"http://fcm.googleapis.com/fcm/send/abc", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://127.0.0.1/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://[::1]:8443/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://localhost/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://api.localhost/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://10.1.2.3/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://[fe80::1]/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://0.0.0.0/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://user:pw@fcm.googleapis.com/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://push.internal.example/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://mixed.example/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://rebind.example/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://metadata.cloud.example/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://cgnat.example/x", true, envelope.KindPermanent, envelope.ClassInvalidRecipient},
		{"https://unknown.example/x", true, envelope.KindRetryable, envelope.ClassNetwork},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			k := mustKeys(t)
			p, err := New(Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "ops@example.com",
				HTTPClient: ok201, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			p.lookup = lookup
			s := sub
			s.Endpoint = tc.endpoint
			_, err = p.Deliver(context.Background(), testKey, pushMessage(s, []byte("x"), time.Hour, "", ""))
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("Deliver: %v, want sent", err)
				}
				return
			}
			de := envelope.Classify(err)
			if de == nil || de.Kind != tc.kind || de.Class != tc.class {
				t.Fatalf("Deliver = %v, want %s %s", err, tc.kind, tc.class)
			}
			if strings.Contains(err.Error(), "example") || strings.Contains(err.Error(), "127.0.0.1") {
				t.Errorf("error text %q names the endpoint", err)
			}
		})
	}
}

// TestGuardedClient_RefusesPrivateAtDial checks the connect-time check of
// the default client, which stops a DNS answer that changes after the
// lookup check.
func TestGuardedClient_RefusesPrivateAtDial(t *testing.T) {
	ps := newPushService(t, nil)
	c := guardedClient()
	defer c.CloseIdleConnections()
	resp, err := c.Get(ps.srv.URL + "/x")
	if err == nil {
		resp.Body.Close()
		t.Fatal("guarded client reached a loopback server")
	}
	if !errors.Is(err, ErrEndpointNotAllowed) {
		t.Errorf("error = %v, want ErrEndpointNotAllowed", err)
	}
	if len(ps.requests()) != 0 {
		t.Errorf("the loopback server saw a request")
	}
	if c.CheckRedirect == nil || c.Transport.(*http.Transport).Proxy != nil {
		t.Errorf("guarded client must not follow redirects nor use a proxy")
	}
}

func TestProvider_Reconcile(t *testing.T) {
	t.Run("DefaultUnknownWithoutSending", func(t *testing.T) {
		ps := newPushService(t, nil)
		p := mustProvider(t, ps, Options{})
		got, err := p.Reconcile(context.Background(), testKey, pushMessage(ps.subscription("/s"), []byte("x"), time.Hour, "", ""))
		if err != nil || got.Outcome != channels.Unknown {
			t.Errorf("Reconcile = %+v, %v; want Unknown", got, err)
		}
		if n := len(ps.requests()); n != 0 {
			t.Errorf("push service saw %d requests, want none", n)
		}
	})
	for _, tc := range []struct {
		name    string
		respond func(http.ResponseWriter, *http.Request)
		want    channels.Outcome
		wantErr bool
	}{
		{"Redeliver201", nil, channels.Accepted, false},
		{"Redeliver410", answer(410, nil, ""), channels.Rejected, false},
		{"Redeliver404", answer(404, nil, ""), channels.Rejected, false},
		{"Redeliver500", answer(500, nil, ""), channels.Unknown, true},
		{"Redeliver429", answer(429, map[string]string{"Retry-After": "3"}, ""), channels.Unknown, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPushService(t, tc.respond)
			p := mustProvider(t, ps, Options{RedeliverOnReconcile: true})
			got, err := p.Reconcile(context.Background(), testKey, pushMessage(ps.subscription("/s"), []byte("x"), time.Hour, "", ""))
			if got.Outcome != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("Reconcile = %+v, %v; want %s (error %v)", got, err, tc.want, tc.wantErr)
			}
			if tc.want == channels.Accepted && got.Receipt.ID == "" {
				t.Errorf("Accepted without a receipt")
			}
			reqs := ps.requests()
			if len(reqs) != 1 || reqs[0].Header.Get("Topic") != testKey.Hash()[:32] {
				t.Errorf("want one re-send under the key's Topic, got %d requests", len(reqs))
			}
		})
	}
}

func TestProvider_Capabilities(t *testing.T) {
	p := mustProvider(t, nil, Options{})
	want := channels.Capabilities{Name: "webpush", Channel: envelope.ChannelPush, IdempotentRedelivery: true}
	if got := p.Capabilities(); got != want {
		t.Errorf("Capabilities = %+v, want %+v", got, want)
	}
}

func TestNew_Validation(t *testing.T) {
	k := mustKeys(t)
	other := mustKeys(t)
	for _, tc := range []struct {
		name    string
		opts    Options
		setting string // must be named in the error
	}{
		{"NoPublicKey", Options{VAPIDPrivateKey: k.Private, Subscriber: "a@b.example"}, "VAPIDPublicKey"},
		{"NoPrivateKey", Options{VAPIDPublicKey: k.Public, Subscriber: "a@b.example"}, "VAPIDPrivateKey"},
		{"NotBase64", Options{VAPIDPublicKey: "!!!" + k.Public, VAPIDPrivateKey: k.Private, Subscriber: "a@b.example"}, "VAPIDPublicKey"},
		{"PrivateNotKey", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: "c2hvcnQ", Subscriber: "a@b.example"}, "VAPIDPrivateKey"},
		{"Swapped", Options{VAPIDPublicKey: string(k.Private), VAPIDPrivateKey: Secret(k.Public), Subscriber: "a@b.example"}, "VAPIDPublicKey"},
		{"NotAPair", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: other.Private, Subscriber: "a@b.example"}, "VAPIDPrivateKey"},
		{"NoSubscriber", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private}, "Subscriber"},
		{"OnlyMailto", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "mailto:"}, "Subscriber"},
		{"HTTPSubscriber", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "http://example.com"}, "Subscriber"},
		{"Localhost", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "me@localhost"}, "Subscriber"},
		{"NotAnAddress", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "ops"}, "Subscriber"},
		{"RecordSizeTooBig", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "a@b.example", RecordSize: 8192}, "RecordSize"},
		{"RecordSizeTooSmall", Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: "a@b.example", RecordSize: 64}, "RecordSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.opts)
			if err == nil {
				t.Fatalf("New succeeded (%v), want an error", p != nil)
			}
			if !strings.Contains(err.Error(), tc.setting) {
				t.Errorf("error %q does not name %s", err, tc.setting)
			}
			for _, v := range []string{k.Public, string(k.Private), other.Public, string(other.Private)} {
				if strings.Contains(err.Error(), v) {
					t.Errorf("error %q contains a key", err)
				}
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{"ops@example.com", "ops@example.com"},
		{"mailto:ops@example.com", "ops@example.com"},
		{" MAILTO:ops@example.com ", "ops@example.com"},
		{"https://example.com/contact", "https://example.com/contact"},
		{"HTTPS://example.com", "https://example.com"},
	} {
		p, err := New(Options{VAPIDPublicKey: k.Public, VAPIDPrivateKey: k.Private, Subscriber: tc.in})
		if err != nil {
			t.Errorf("New(Subscriber %q): %v", tc.in, err)
			continue
		}
		if p.subscriber != tc.want {
			t.Errorf("Subscriber %q became %q, want %q", tc.in, p.subscriber, tc.want)
		}
		if p.PublicKey() != k.Public {
			t.Errorf("PublicKey() is not the configured key")
		}
	}
}
