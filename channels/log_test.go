package channels_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

func TestLogRequest(t *testing.T) {
	const secret = "user@example.com: mailbox full"
	hint := func(err error, de *envelope.DeliveryError) (slog.Level, string) {
		if de.Class == envelope.ClassAuthFailed {
			return slog.LevelWarn, "check the token"
		}
		return slog.LevelInfo, ""
	}
	for _, tc := range []struct {
		name string
		req  channels.Request
		err  error
		want []string
		not  []string
	}{
		{"sent", channels.Request{Operation: "deliver", Status: 200}, nil,
			[]string{`"level":"DEBUG"`, `"msg":"svc message sent"`, `"operation":"deliver"`, `"status":200`}, []string{"errcode", "error_class"}},
		{"retry after", channels.Request{Operation: "deliver", Status: 429, CodeName: "errcode", Code: 45009},
			envelope.RetryAfter(envelope.ClassRateLimited, 3*time.Second, errors.New(secret)),
			[]string{`"level":"INFO"`, `"msg":"svc message failed"`, `"errcode":45009`, `"error_class":"rate_limited"`, `"retry_after":3000000000`}, []string{"hint"}},
		{"hint", channels.Request{Operation: "gettoken", Status: 401},
			envelope.Permanent(envelope.ClassAuthFailed, errors.New(secret)),
			[]string{`"level":"WARN"`, `"hint":"check the token"`, `"kind":"permanent"`, `"operation":"gettoken"`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			channels.LogRequest(context.Background(), log, "svc message", tc.req, tc.err, hint)
			out := buf.String()
			if strings.Count(out, "\n") != 1 {
				t.Fatalf("want one record, got %q", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("record lacks %s: %s", w, out)
				}
			}
			for _, n := range append(tc.not, "example.com", "mailbox") {
				if strings.Contains(out, n) {
					t.Errorf("record has %s: %s", n, out)
				}
			}
		})
	}
}
