// Command embed is the README's "Use as a library" example, whole: a Go
// backend that keeps its delivery queue in a directory, records a user's
// consent, enqueues a weekly digest, delivers it with a worker (to the
// sink here; resend.New in production) and serves the one-click
// unsubscribe link the e-mail carries. A test keeps the README's snippet
// equal to the part between the README markers.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/sink"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

func main() {
	dir, err := os.MkdirTemp("", "outbox-embed-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := run(context.Background(), dir, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dir string, out io.Writer) error {
	// README begin
	q, err := filestore.Open(dir, nil) // nil Options = defaults
	if err != nil {
		return err
	}
	defer q.Close()

	// Unsubscribe links are signed with a key kept in the data directory;
	// the renderer puts them in every e-mail, the HTTP handler checks them.
	key, err := httpapi.LoadOrCreateKey(dir)
	if err != nil {
		return err
	}
	unsub := httpapi.NewUnsubscriber(key, "https://app.example.org")
	r, err := render.New(&render.Options{BaseURL: "https://app.example.org", UnsubscribeURL: unsub.URL})
	if err != nil {
		return err
	}
	email, err := sink.New(dir, envelope.ChannelEmail, nil) // or resend.New(…)
	if err != nil {
		return err
	}
	w, err := worker.New(worker.Config{
		Store: q, Renderer: r,
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelEmail: email},
	})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }() // stops claiming when ctx ends
	defer func() { stop(); <-done }()  // before q.Close

	// E-mail needs digest_enabled and email_verified (push: push_enabled):
	// without a record, enqueue refuses the envelope (no_consent).
	if err := q.SetConsent(ctx, "", "u_42", queue.ConsentFlags{DigestEnabled: true, EmailVerified: true, By: "signup"}); err != nil {
		return err
	}
	at := int64(642_000) // where in the episode the quote is, in ms
	payload, _ := json.Marshal(envelope.DigestPayload{Sections: []envelope.Section{{
		Kind: envelope.SectionRevisit, Items: []envelope.Item{{
			Quote: "Simple is often erroneously mistaken for easy.", EpisodeSlug: "ep-145", EpisodeTitle: "Simple Made Easy", TMs: &at,
			GraphRefs: []envelope.GraphRef{{ID: "topic:design", Kind: "topic", Label: "Design"}},
			DeepLink:  "https://app.example.org/episodes/ep-145?t=642", Source: "user",
		}},
	}}})
	res, err := q.Enqueue(ctx, &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: "digest/u_42/2026-W49", UserID: "u_42",
		Channel: envelope.ChannelEmail, Template: envelope.TemplateDigest,
		Recipient:       envelope.Recipient{Email: "reader@example.org", EmailVerified: true},
		ConsentSnapshot: envelope.ConsentSnapshot{DigestEnabled: true, Cadence: "weekly", UnsubscribeRef: "ur_42"},
		Payload:         payload,
		CreatedAt:       time.Now(),
	}) // durable (fsynced) when it returns; res[0].Duplicate on a repeat
	if err != nil {
		return err
	}

	// The unsubscribe link (and, with a token, /v1 and the seam) is served
	// by the HTTP handler.
	api, err := httpapi.New(httpapi.Config{Store: q, Unsub: unsub})
	if err != nil {
		return err
	}
	// README end

	fmt.Fprintln(out, "enqueued:", res[0].ID, "duplicate:", res[0].Duplicate)
	st, err := waitDelivered(ctx, q, res[0].ID)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "status:", st.Status)

	// The sink wrote the e-mail; its List-Unsubscribe link works.
	link, err := unsubscribeLink(email.Path(envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: res[0].ID}))
	if err != nil {
		return err
	}
	u, err := url.Parse(link)
	if err != nil {
		return err
	}
	req := httptest.NewRequest(http.MethodPost, u.Path, strings.NewReader("List-Unsubscribe=One-Click"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	c, err := q.Consent(ctx, "", "u_42")
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "one-click unsubscribe:", rec.Code, "digest_enabled:", c.DigestEnabled)
	return nil
}

// waitDelivered waits (bounded) until the worker delivered id.
func waitDelivered(ctx context.Context, q queue.Store, id string) (*queue.EnvelopeStatus, error) {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := q.Get(ctx, "", id)
		if err != nil {
			return nil, err
		}
		if st.Status == queue.StatusDelivered || time.Now().After(deadline) {
			return st, nil
		}
	}
}

// unsubscribeLink reads the List-Unsubscribe URL of an .eml file.
func unsubscribeLink(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "List-Unsubscribe: "); ok {
			return strings.Trim(v, "<>"), nil
		}
	}
	return "", fmt.Errorf("%s: no List-Unsubscribe header", path)
}
