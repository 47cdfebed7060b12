package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// storageFaultStore fails every write with err, wrapped the way the file
// store wraps an I/O error (an *os.PathError naming the log, inside an
// *queue.EnqueueError for Enqueue).
type storageFaultStore struct {
	queue.Store
	err syscall.Errno
}

const faultPath = "/var/lib/outbox/logs/default-0123/u_secret_person-4567.jsonl"

func (s storageFaultStore) wrapped() error {
	return fmt.Errorf("append to log: %w", &os.PathError{Op: "write", Path: faultPath, Err: s.err})
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
// is answered with what failed (507 storage_full, 503 storage_read_only,
// 503 storage_permission_denied) instead of internal_error, on
// every route that writes, with a fixed message that holds no path or id,
// and is logged with its code.
func TestStorageErrors_SayWhatFailed(t *testing.T) {
	for _, tc := range []struct {
		errno  syscall.Errno
		status int
		code   string
		phrase string
	}{
		{syscall.ENOSPC, http.StatusInsufficientStorage, CodeStorageFull, "storage full"},
		{syscall.EDQUOT, http.StatusInsufficientStorage, CodeStorageFull, "storage full"},
		{syscall.EROFS, http.StatusServiceUnavailable, CodeStorageReadOnly, "storage read-only"},
		{syscall.EACCES, http.StatusServiceUnavailable, CodeStorageDenied, "storage access refused"},
		{syscall.EPERM, http.StatusServiceUnavailable, CodeStorageDenied, "storage access refused"},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			f := newFixture(t)
			f.grant("", "u_secret_person")
			f.cfg.Store = storageFaultStore{Store: f.q, err: tc.errno}
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
				for _, leak := range []string{"u_secret_person", "/var/lib", ".jsonl", tc.errno.Error()} {
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
