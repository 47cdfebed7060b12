package httpapi

import (
	"net/http"
	"strings"
	"testing"
)

// A rotation: the old token alone, then the old and the new, then the new
// alone, on one handler that keeps serving. A refused Set leaves the set
// as it was and never names a token's value.
func TestTokens_Rotation(t *testing.T) {
	const next = "next-token-0d4b2a9e8f7c6b5a"
	set, err := NewTokens(testToken)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Token, c.Tokens = "", set })
	status := func(tok string) int { return f.call("GET", "/v1/stats", "", withAuth("Bearer "+tok)).Code }
	if status(testToken) != http.StatusOK || status(next) != http.StatusUnauthorized {
		t.Fatalf("before: old %d, new %d", status(testToken), status(next))
	}
	if err := set.Set(testToken, next); err != nil {
		t.Fatal(err)
	}
	if status(testToken) != http.StatusOK || status(next) != http.StatusOK || set.Len() != 2 {
		t.Fatalf("during: old %d, new %d", status(testToken), status(next))
	}
	if err := set.Set(next); err != nil {
		t.Fatal(err)
	}
	if status(testToken) != http.StatusUnauthorized || status(next) != http.StatusOK {
		t.Fatalf("after: old %d, new %d", status(testToken), status(next))
	}

	const short = "short-secret"
	for _, bad := range [][]string{nil, {next, short}, {next, "has a space in it, long enough"}, make([]string, MaxTokens+1)} {
		err := set.Set(bad...)
		if err == nil || strings.Contains(err.Error(), short) || strings.Contains(err.Error(), next) {
			t.Errorf("Set(%d tokens) = %v", len(bad), err)
		}
		if status(next) != http.StatusOK || set.Len() != 1 {
			t.Fatalf("a refused Set changed the set")
		}
	}
	if _, err := New(Config{Store: f.q, Token: testToken, Tokens: set}); err == nil {
		t.Fatal("New took both Token and Tokens")
	}
}
