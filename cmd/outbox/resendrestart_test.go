package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// keyedResend is a Resend API that keeps each Idempotency-Key's e-mail, as
// Resend does for 24 hours: a request again under a known key is answered
// with the first e-mail's id and sends nothing. The first request of each
// key is held (the e-mail accepted, the answer not given) until the
// serving process dies.
type keyedResend struct {
	mu      sync.Mutex
	ids     map[string]string // key → e-mail id
	calls   map[string]int
	emails  int // e-mails actually sent
	started chan string
}

func newKeyedResend(t *testing.T) (*keyedResend, *httptest.Server) {
	f := &keyedResend{ids: map[string]string{}, calls: map[string]int{}, started: make(chan string, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/emails" {
			http.Error(w, `{"statusCode":404,"name":"not_found","message":"no route"}`, http.StatusNotFound)
			return
		}
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		f.mu.Lock()
		f.calls[key]++
		id, known := f.ids[key]
		if !known {
			f.emails++
			id = fmt.Sprintf("4ef9a417-02e9-4d39-ad75-%012d", f.emails)
			f.ids[key] = id
		}
		f.mu.Unlock()
		if !known {
			f.started <- key
			<-r.Context().Done() // accepted; the answer is lost with the process
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q}`, id)
	}))
	t.Cleanup(srv.Close)
	return f, srv
}

// serve killed while Resend had accepted an e-mail but not answered: the
// serve started after it replays the request under the same key (the
// envelope was enqueued well within Resend's 24 h), gets the first
// e-mail's id and settles the row as sent. Before, the restarted process
// did not know when the key was first sent and left the row unresolved
// for an operator.
func TestServe_KilledMidResendCallIsSettledByTheNextServe(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "resend-restart-token-0123456789"
	f, srv := newKeyedResend(t)
	env := []string{"INTERNAL_OUTBOX_TOKEN=" + token, "RESEND_API_KEY=re_test_0123456789abcdef"}
	args := []string{"--lease", "1s", "--email-from", "news@example.org", "--resend-poll", "0", "--resend-api", srv.URL}
	start := func() *daemon {
		d, out, code := launchServe(t, bin, data, env, args...)
		if d == nil {
			t.Fatalf("serve exited with %d:\n%s", code, out)
		}
		return d
	}
	d := start()
	if code, b := request(t, "PUT", d.base+"/v1/consent/u_42", token, []byte(`{"digest_enabled":true,"email_verified":true}`)); code != 200 {
		t.Fatalf("consent: %d %s", code, b)
	}
	raw, err := os.ReadFile(digestFixture)
	if err != nil {
		t.Fatal(err)
	}
	var digest map[string]any
	if err := json.Unmarshal(raw, &digest); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	digest["created_at"], digest["not_before"], digest["expires_at"] = now.Format(time.RFC3339), now.Format(time.RFC3339), now.Add(24*time.Hour).Format(time.RFC3339)
	raw, _ = json.Marshal(digest)
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, raw); code != http.StatusCreated {
		t.Fatalf("POST: %d %s", code, b)
	}
	key := <-f.started
	d.kill()

	d = start()
	defer d.stop(t)
	id := digest["id"].(string)
	var last string
	eventually(t, "the digest settled", func() bool {
		_, b := request(t, "GET", d.base+"/v1/envelopes/"+url.PathEscape(id), token, nil)
		last = string(b)
		return strings.Contains(last, `"status":"delivered"`) || strings.Contains(last, `"unresolved"`)
	})
	if !strings.Contains(last, `"status":"delivered"`) {
		t.Fatalf("after the restart the digest is %s\nserve:\n%s", last, d.logs.String())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.emails != 1 || f.calls[key] != 2 {
		t.Errorf("Resend sent %d e-mails and had %d requests under the key, want 1 and 2", f.emails, f.calls[key])
	}
}
