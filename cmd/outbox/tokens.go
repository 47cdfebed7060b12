package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/outboxhq/outbox/queue/httpapi"
)

// tokenFile is the INTERNAL_OUTBOX_TOKEN_FILE serve watches, and what it
// looked like just before serve read it: a change made after that (while
// serve starts) is a change to the watcher.
type tokenFile struct {
	path string
	seen os.FileInfo
}

// serveTokens reads the bearer tokens of serve: INTERNAL_OUTBOX_TOKEN
// (one), or the lines of INTERNAL_OUTBOX_TOKEN_FILE, which it returns
// (serve watches it; path "" for none). None is no error: /v1 and
// /internal are then not served.
func serveTokens(e *env) (tokens []string, file tokenFile, err error) {
	const name = "INTERNAL_OUTBOX_TOKEN"
	path := strings.TrimSpace(e.Getenv(name + "_FILE"))
	if path == "" || strings.TrimSpace(e.Getenv(name)) != "" {
		// The variable alone, or secret's error for both.
		v, err := secret(e, name)
		switch {
		case err != nil:
			return nil, tokenFile{}, err
		case v == "":
			return nil, tokenFile{}, nil
		case len(v) < httpapi.MinTokenBytes:
			return nil, tokenFile{}, fmt.Errorf("%s is %d bytes; it must be at least %d (e.g. openssl rand -hex 32)", name, len(v), httpapi.MinTokenBytes)
		}
		return []string{v}, tokenFile{}, nil
	}
	seen, _ := os.Stat(path) // before the read: a change after it is seen
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, tokenFile{}, fmt.Errorf("read %s_FILE: %w", name, err)
	}
	if tokens, err = parseTokenFile(b); err != nil {
		return nil, tokenFile{}, fmt.Errorf("%s_FILE %s: %w", name, path, err)
	}
	return tokens, tokenFile{path, seen}, nil
}

// parseTokenFile reads one token per line; blank lines and lines that
// start with # are skipped. Errors name a line, never its content.
func parseTokenFile(b []byte) ([]string, error) {
	var out []string
	for i, line := range bytes.Split(b, []byte("\n")) {
		tok := string(bytes.TrimSpace(line))
		if tok == "" || strings.HasPrefix(tok, "#") {
			continue
		}
		switch {
		case len(tok) < httpapi.MinTokenBytes:
			return nil, fmt.Errorf("line %d: the token is %d bytes; it must be at least %d (e.g. openssl rand -hex 32)", i+1, len(tok), httpapi.MinTokenBytes)
		case strings.ContainsAny(tok, " \t"):
			return nil, fmt.Errorf("line %d: a token holds no space (one token per line)", i+1)
		}
		out = append(out, tok)
	}
	if len(out) > httpapi.MaxTokens {
		return nil, fmt.Errorf("%d tokens; at most %d", len(out), httpapi.MaxTokens)
	}
	return out, nil
}

// tokenPoll is how often serve looks at INTERNAL_OUTBOX_TOKEN_FILE.
var tokenPoll = time.Second

// watchTokens gives set the tokens of file whenever the file changes,
// until ctx ends: a token is rotated by listing the new one beside the old,
// moving the clients, then removing the old. A file that cannot be read or
// holds no valid token leaves the tokens in use, with a warning.
func watchTokens(ctx context.Context, tf tokenFile, set *httpapi.Tokens, log *slog.Logger) {
	const op = "tokens"
	file, last := tf.path, tf.seen
	failing := ""
	warn := func(why string) {
		if why != failing {
			log.Warn("INTERNAL_OUTBOX_TOKEN_FILE "+file+": "+why+"; the tokens in use stay", "operation", op, "status", "kept", "tokens", set.Len())
		}
		failing = why
	}
	t := time.NewTicker(tokenPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(file)
		if err != nil {
			warn("cannot be read (" + errClass(err) + ")")
			continue
		}
		if last != nil && os.SameFile(fi, last) && fi.ModTime().Equal(last.ModTime()) && fi.Size() == last.Size() && failing == "" {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			warn("cannot be read (" + errClass(err) + ")")
			continue
		}
		last = fi
		toks, err := parseTokenFile(b)
		if err == nil && len(toks) == 0 {
			err = fmt.Errorf("no token in it")
		}
		if err == nil {
			err = set.Set(toks...)
		}
		if err != nil {
			warn(err.Error())
			continue
		}
		failing = ""
		log.Info("INTERNAL_OUTBOX_TOKEN_FILE "+file+" changed: its tokens are the ones accepted now", "operation", op, "status", "reloaded", "tokens", len(toks))
	}
}

// errClass names a file error without its path.
func errClass(err error) string {
	switch {
	case os.IsNotExist(err):
		return "missing"
	case os.IsPermission(err):
		return "permission denied"
	}
	return "error"
}
