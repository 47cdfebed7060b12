package httpapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// MaxTokens is the most bearer tokens a Tokens set holds.
const MaxTokens = 16

// Tokens is the set of bearer tokens that /v1 and /internal accept. Set
// replaces it while the handler serves, which is how a token is rotated
// without a restart: list the old token and the new one, move every client
// to the new one, then list it alone.
type Tokens struct {
	key  []byte                   // random key of the HMACs
	macs atomic.Pointer[[][]byte] // HMAC of each token under key
}

// NewTokens returns a set holding tokens (see Set).
func NewTokens(tokens ...string) (*Tokens, error) {
	t := &Tokens{key: make([]byte, 32)}
	if _, err := rand.Read(t.key); err != nil {
		return nil, fmt.Errorf("httpapi: token key: %w", err)
	}
	return t, t.Set(tokens...)
}

// Set replaces the tokens: 1 to MaxTokens, each at least MinTokenBytes
// long and without spaces. On an error the set is unchanged; the error
// names a token by its position, never by its value.
func (t *Tokens) Set(tokens ...string) error {
	if len(tokens) == 0 {
		return errors.New("httpapi: no token")
	}
	if len(tokens) > MaxTokens {
		return fmt.Errorf("httpapi: %d tokens; at most %d", len(tokens), MaxTokens)
	}
	macs := make([][]byte, len(tokens))
	for i, tok := range tokens {
		switch {
		case len(tok) < MinTokenBytes:
			return fmt.Errorf("httpapi: token %d is %d bytes; it must be at least %d", i+1, len(tok), MinTokenBytes)
		case strings.ContainsAny(tok, " \t\r\n"):
			return fmt.Errorf("httpapi: token %d holds a space", i+1)
		}
		macs[i] = t.mac(tok)
	}
	t.macs.Store(&macs)
	return nil
}

// Len is how many tokens the set holds.
func (t *Tokens) Len() int { return len(*t.macs.Load()) }

func (t *Tokens) mac(tok string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte(tok))
	return m.Sum(nil)
}

// match reports whether tok is one of the set. Each comparison is of two
// HMAC-SHA256 values of equal length under a random key, in constant time
// (crypto/subtle), and every token is compared, so neither a token's bytes,
// its length nor which token matched leak through timing.
func (t *Tokens) match(tok string) bool {
	got := t.mac(tok)
	ok := 0
	for _, m := range *t.macs.Load() {
		ok |= subtle.ConstantTimeCompare(got, m)
	}
	return ok == 1
}
