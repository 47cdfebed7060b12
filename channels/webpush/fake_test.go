package webpush

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// pushRequest is what the fake push service saw of one request.
type pushRequest struct {
	Path      string
	Header    http.Header
	BodyLen   int
	Plaintext []byte // the decrypted payload
	RS        uint32 // the record size announced in the body's header
	Claims    map[string]any
	VAPIDKey  string // the k= of the Authorization header
	DecodeErr error  // why decrypting or verifying failed, if it did
}

// pushService is a local stand-in for a push service (Mozilla autopush,
// FCM, Apple): it checks what a real one checks (the VAPID JWT, the
// aes128gcm body), decrypts the payload with the subscription's private
// key, records the request and answers with respond.
type pushService struct {
	srv     *httptest.Server
	uaPriv  *ecdh.PrivateKey
	auth    []byte
	respond func(w http.ResponseWriter, r *http.Request)

	mu   sync.Mutex
	reqs []pushRequest
}

// newPushService starts a TLS push service answering with respond (201 with
// a Location when nil), closed when the test ends.
func newPushService(t testing.TB, respond func(w http.ResponseWriter, r *http.Request)) *pushService {
	t.Helper()
	uaPriv, auth := mustBrowserKeys(t)
	return newPushServiceFor(t, uaPriv, auth, respond)
}

// mustBrowserKeys generates a subscription's keys the way a browser does:
// a P-256 ECDH pair (p256dh) and a 16-byte auth secret.
func mustBrowserKeys(t testing.TB) (*ecdh.PrivateKey, []byte) {
	t.Helper()
	uaPriv, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	auth := make([]byte, 16)
	if _, err := rand.Read(auth); err != nil {
		t.Fatal(err)
	}
	return uaPriv, auth
}

// newPushServiceFor starts a push service for the subscription keys given.
func newPushServiceFor(t testing.TB, uaPriv *ecdh.PrivateKey, auth []byte, respond func(w http.ResponseWriter, r *http.Request)) *pushService {
	t.Helper()
	if respond == nil {
		respond = created
	}
	ps := &pushService{uaPriv: uaPriv, auth: auth, respond: respond}
	ps.srv = httptest.NewUnstartedServer(http.HandlerFunc(ps.serve))
	// Handshakes cut short by the test's end are expected; keep them out
	// of the output.
	ps.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	ps.srv.StartTLS()
	t.Cleanup(func() {
		ps.srv.Close()
		ps.srv.Client().CloseIdleConnections()
	})
	return ps
}

// created answers 201 with a Location, like every real push service.
func created(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Location", "https://push.example/m/"+strings.TrimPrefix(r.URL.Path, "/"))
	w.Header().Set("TTL", r.Header.Get("TTL"))
	w.WriteHeader(http.StatusCreated)
}

// answer returns a responder that writes status, headers and a body the way
// a push service does for errors.
func answer(status int, header map[string]string, body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// hang blocks until the client gives up, then drops the connection without
// an answer (returning normally would make net/http write an implicit 200,
// which a client still reading could take for an acceptance).
func hang(w http.ResponseWriter, r *http.Request) {
	<-r.Context().Done()
	panic(http.ErrAbortHandler)
}

func (ps *pushService) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	req := pushRequest{Path: r.URL.Path, Header: r.Header.Clone(), BodyLen: len(body)}
	if err == nil && r.Method != http.MethodPost {
		err = fmt.Errorf("method %s, want POST", r.Method)
	}
	if err == nil {
		req.Claims, req.VAPIDKey, err = verifyVAPID(r.Header.Get("Authorization"))
	}
	if err == nil {
		req.Plaintext, req.RS, err = decryptAES128GCM(body, ps.uaPriv, ps.auth)
	}
	req.DecodeErr = err
	ps.mu.Lock()
	ps.reqs = append(ps.reqs, req)
	ps.mu.Unlock()
	if err != nil {
		// A real service refuses what it cannot read or authenticate.
		http.Error(w, `{"code":400,"errno":110,"error":"Bad Request"}`, http.StatusBadRequest)
		return
	}
	ps.respond(w, r)
}

// requests returns what the service saw so far.
func (ps *pushService) requests() []pushRequest {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return append([]pushRequest(nil), ps.reqs...)
}

// subscription returns the W3C PushSubscription a browser would hand out
// for this service, with the endpoint at path.
func (ps *pushService) subscription(path string) envelope.PushSubscription {
	return envelope.PushSubscription{
		Endpoint: ps.srv.URL + path,
		Keys: envelope.PushKeys{
			P256dh: base64.RawURLEncoding.EncodeToString(ps.uaPriv.PublicKey().Bytes()),
			Auth:   base64.RawURLEncoding.EncodeToString(ps.auth),
		},
	}
}

// dialingClient returns a client that sends every request to this service
// whatever the URL's host (any *.example.com name passes the test
// certificate), so a message can carry a realistic endpoint.
func (ps *pushService) dialingClient(t testing.TB) *http.Client {
	t.Helper()
	tr := ps.srv.Client().Transport.(*http.Transport).Clone()
	addr := ps.srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := &http.Client{Transport: tr}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// decryptAES128GCM decrypts an RFC 8291 message body (RFC 8188 aes128gcm,
// one record) with the user agent's keys and strips the padding.
func decryptAES128GCM(body []byte, uaPriv *ecdh.PrivateKey, auth []byte) ([]byte, uint32, error) {
	if len(body) < 21 {
		return nil, 0, errors.New("body shorter than the aes128gcm header")
	}
	salt := body[:16]
	rs := binary.BigEndian.Uint32(body[16:20])
	idlen := int(body[20])
	if len(body) < 21+idlen {
		return nil, rs, errors.New("truncated key id")
	}
	keyid := body[21 : 21+idlen]
	ct := body[21+idlen:]
	asPub, err := ecdh.P256().NewPublicKey(keyid)
	if err != nil {
		return nil, rs, fmt.Errorf("key id is not a P-256 key: %w", err)
	}
	secret, err := uaPriv.ECDH(asPub)
	if err != nil {
		return nil, rs, err
	}
	info := append([]byte("WebPush: info\x00"), uaPriv.PublicKey().Bytes()...)
	info = append(info, keyid...)
	ikm, err := hkdf.Key(sha256.New, secret, auth, string(info), 32)
	if err != nil {
		return nil, rs, err
	}
	cek, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, rs, err
	}
	nonce, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, rs, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, rs, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, rs, err
	}
	pt, err := gcm.Open(nil, nonce, ct, nil)
	if err != nil {
		return nil, rs, fmt.Errorf("decrypt: %w", err)
	}
	i := len(pt) - 1
	for i >= 0 && pt[i] == 0 {
		i--
	}
	if i < 0 || pt[i] != 0x02 {
		return nil, rs, errors.New("no last-record padding delimiter")
	}
	return pt[:i], rs, nil
}

// verifyVAPID checks an RFC 8292 Authorization header ("vapid t=JWT,
// k=KEY"): the ES256 signature under k, and returns the JWT claims.
func verifyVAPID(h string) (map[string]any, string, error) {
	rest, ok := strings.CutPrefix(h, "vapid ")
	if !ok {
		return nil, "", errors.New("authorization scheme is not vapid")
	}
	var tok, k string
	for part := range strings.SplitSeq(rest, ",") {
		part = strings.TrimSpace(part)
		switch {
		case strings.HasPrefix(part, "t="):
			tok = part[2:]
		case strings.HasPrefix(part, "k="):
			k = part[2:]
		}
	}
	if tok == "" || k == "" {
		return nil, "", errors.New("missing t= or k=")
	}
	pubBytes, err := base64.RawURLEncoding.DecodeString(k)
	if err != nil {
		return nil, k, err
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), pubBytes)
	if err != nil {
		return nil, k, err
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, k, errors.New("JWT is not three parts")
	}
	var hdr map[string]any
	if err := decodeSegment(parts[0], &hdr); err != nil {
		return nil, k, err
	}
	if hdr["alg"] != "ES256" {
		return nil, k, fmt.Errorf("JWT alg %v, want ES256", hdr["alg"])
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return nil, k, errors.New("JWT signature is not 64 bytes")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return nil, k, errors.New("JWT signature does not verify under k")
	}
	var claims map[string]any
	if err := decodeSegment(parts[1], &claims); err != nil {
		return nil, k, err
	}
	return claims, k, nil
}

func decodeSegment(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// mustKeys generates a VAPID key pair.
func mustKeys(t testing.TB) Keys {
	t.Helper()
	k, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mustProvider builds a provider for ps with opts' zero fields filled in:
// fresh keys, a subscriber, the service's TLS client and insecure endpoints
// (the service listens on loopback).
func mustProvider(t testing.TB, ps *pushService, opts Options) *Provider {
	t.Helper()
	if opts.VAPIDPublicKey == "" {
		k := mustKeys(t)
		opts.VAPIDPublicKey, opts.VAPIDPrivateKey = k.Public, k.Private
	}
	if opts.Subscriber == "" {
		opts.Subscriber = "ops@example.com"
	}
	if opts.HTTPClient == nil && ps != nil {
		opts.HTTPClient = ps.srv.Client()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.AllowInsecureEndpoints = true
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// pushMessage wraps a PushMessage as a Message.
func pushMessage(sub envelope.PushSubscription, payload []byte, ttl time.Duration, urgency, topic string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelPush, Push: &envelope.PushMessage{
		Subscription: sub, Payload: payload, TTL: ttl, Urgency: urgency, Topic: topic,
	}}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a log sink).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
