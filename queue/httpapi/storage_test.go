package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// storageFaultStore fails every write with err: a system call's error
// wrapped the way the file store wraps one (an *os.PathError naming the
// log, inside an *queue.EnqueueError for Enqueue), or a database store's
// own error.
type storageFaultStore struct {
	queue.Store
	err error
}

const faultPath = "/var/lib/outbox/logs/default-0123/u_secret_person-4567.jsonl"

func (s storageFaultStore) wrapped() error {
	if errno, ok := s.err.(syscall.Errno); ok {
		return fmt.Errorf("append to log: %w", &os.PathError{Op: "write", Path: faultPath, Err: errno})
	}
	return fmt.Errorf("enqueue: %w", s.err)
}

// dbStateError is a database store's refusal for its state (as
// pgstore.StateError): queue.ErrUnavailable and one kind.
type dbStateError struct{ kind error }

func (e dbStateError) Error() string {
	return "pgstore: enqueue: SQLSTATE 25006 in schema secret_schema"
}
func (e dbStateError) Is(target error) bool {
	return target == queue.ErrUnavailable || target == e.kind
}

func (s storageFaultStore) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	return nil, &queue.EnqueueError{Index: 0, Err: s.wrapped()}
}

func (s storageFaultStore) SetConsent(ctx context.Context, tenant, userID string, c queue.ConsentFlags) error {
	return s.wrapped()
}

func (s storageFaultStore) Requeue(ctx context.Context, tenant, id string) error {
	return fmt.Errorf("requeue: %w", s.wrapped())
}

func (s storageFaultStore) Suppress(ctx context.Context, tenant, userID string, sup queue.Suppression) error {
	return s.wrapped()
}

// A full disk, a read-only file system or a file the store may not open
// (and a database's full disk, read-only state or missing privilege) is
// answered with what failed (507 storage_full, 503 storage_read_only, 503
// storage_permission_denied) instead of internal_error or unavailable, on
// every route that writes, with a fixed message that holds no path or id,
// and is logged with its code.
func TestStorageErrors_SayWhatFailed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
		phrase string
	}{
		{"ENOSPC", syscall.ENOSPC, http.StatusInsufficientStorage, CodeStorageFull, "storage full"},
		{"EDQUOT", syscall.EDQUOT, http.StatusInsufficientStorage, CodeStorageFull, "storage full"},
		{"EROFS", syscall.EROFS, http.StatusServiceUnavailable, CodeStorageReadOnly, "storage read-only"},
		{"EACCES", syscall.EACCES, http.StatusServiceUnavailable, CodeStorageDenied, "storage access refused"},
		{"EPERM", syscall.EPERM, http.StatusServiceUnavailable, CodeStorageDenied, "storage access refused"},
		{"database full", dbStateError{queue.ErrStorageFull}, http.StatusInsufficientStorage, CodeStorageFull, "storage full"},
		{"database read-only", dbStateError{queue.ErrStorageReadOnly}, http.StatusServiceUnavailable, CodeStorageReadOnly, "standby or read-only"},
		{"database privilege", dbStateError{queue.ErrStorageDenied}, http.StatusServiceUnavailable, CodeStorageDenied, "no privilege"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.grant("", "u_secret_person")
			f.cfg.Store = storageFaultStore{Store: f.q, err: tc.err}
			f.reopen()
			for _, r := range []struct{ name, method, target, body string }{
				{"Enqueue", "POST", "/v1/envelopes", mustJSON(t, digest("d/u_secret_person/1", "u_secret_person"))},
				{"SetConsent", "PUT", "/v1/consent/u_secret_person", `{"digest_enabled":true}`},
				{"Requeue", "POST", "/v1/envelopes/d%2Fu_secret_person%2F1/requeue", ""},
			} {
				w := f.call(r.method, r.target, r.body)
				e := wantError(t, w, tc.status, tc.code)
				if !strings.Contains(e.Error.Message, tc.phrase) {
					t.Errorf("%s: message %q does not say %q", r.name, e.Error.Message, tc.phrase)
				}
				for _, leak := range []string{"u_secret_person", "/var/lib", ".jsonl", tc.err.Error(), "SQLSTATE", "secret_schema"} {
					if strings.Contains(w.Body.String(), leak) {
						t.Errorf("%s: response %s holds %q", r.name, w.Body.String(), leak)
					}
				}
			}
			// The one-click unsubscribe answers in plain text with the
			// same status.
			path := "/unsubscribe/" + f.unsub.Token("default", "u_secret_person", envelope.ChannelEmail, "r")
			if w := f.call("POST", path, "", noAuth); w.Code != tc.status {
				t.Errorf("unsubscribe: status %d, want %d", w.Code, tc.status)
			}
			logs := f.logs.String()
			if !strings.Contains(logs, "code="+tc.code) {
				t.Errorf("logs lack code=%s:\n%s", tc.code, logs)
			}
			if strings.Contains(logs, "u_secret_person") || strings.Contains(logs, faultPath) {
				t.Errorf("logs hold the path or the user:\n%s", logs)
			}
		})
	}
}

// stalledStore never answers: every call waits for its context, as a call
// to a stalled database server does (no statement_timeout of the server's
// can end it).
type stalledStore struct{ queue.Store }

func (s stalledStore) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s stalledStore) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("get: %w", ctx.Err())
}

// A store that does not answer is answered 503 unavailable ("store
// unavailable") once Config.StoreTimeout has passed, and logged, instead
// of holding the request for as long as the client waits.
func TestStoreTimeout_StalledStore(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.cfg.Store = stalledStore{Store: f.q}
	f.cfg.StoreTimeout = 150 * time.Millisecond
	f.reopen()
	for _, r := range []struct{ method, target, body string }{
		{"POST", "/v1/envelopes", mustJSON(t, digest("d/u_1/1", "u_1"))},
		{"GET", "/v1/envelopes/d%2Fu_1%2F1", ""},
	} {
		answered := make(chan *httptest.ResponseRecorder, 1)
		go func() { answered <- f.call(r.method, r.target, r.body) }()
		var w *httptest.ResponseRecorder
		select {
		case w = <-answered:
		case <-time.After(30 * time.Second): // a bound against a hang, not a speed claim
			t.Fatalf("%s %s: no answer 30 s into a store that never answers", r.method, r.target)
		}
		e := wantError(t, w, http.StatusServiceUnavailable, CodeUnavailable)
		if !strings.Contains(e.Error.Message, "store unavailable") || !strings.Contains(e.Error.Message, "did not answer in time") {
			t.Errorf("%s %s: message %q", r.method, r.target, e.Error.Message)
		}
	}
	if !strings.Contains(f.logs.String(), "code=unavailable") {
		t.Errorf("the timeouts are not logged:\n%s", f.logs.String())
	}
}
