package pgstore_test

import (
	"context"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// TestConsentHistory: every consent record written is kept in
// consent_history, oldest first, and Erase deletes the user's history too.
func TestConsentHistory(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetConsent(ctx, "", "u-1", queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Suppress(ctx, "", "u-1", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetConsent(ctx, "", "u-2", queue.ConsentFlags{PushEnabled: true}); err != nil {
		t.Fatal(err)
	}
	history := func(user string) []queue.Consent {
		rows, err := pgtest.Admin().Query(ctx, `SELECT record FROM `+schema+`.consent_history WHERE user_id = $1 ORDER BY n`, user)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []queue.Consent
		for rows.Next() {
			var c queue.Consent
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		return out
	}
	h := history("u-1")
	if len(h) != 2 || !h[0].DigestEnabled || len(h[0].Suppressions) != 0 || len(h[1].Suppressions) != 1 {
		t.Fatalf("history of u-1 = %+v, want the grant, then the grant with the suppression", h)
	}
	if err := s.Erase(ctx, "", "u-1"); err != nil {
		t.Fatal(err)
	}
	if h := history("u-1"); len(h) != 0 {
		t.Fatalf("history of u-1 after Erase = %+v, want none", h)
	}
	if h := history("u-2"); len(h) != 1 {
		t.Fatalf("history of u-2 after erasing u-1 = %+v, want its one record", h)
	}
}
