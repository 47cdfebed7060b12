package telegram

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// EnvToken is the environment variable TokenFromEnv reads (or, with a
// "_FILE" suffix, the file holding the token).
const EnvToken = "OUTBOX_TELEGRAM_TOKEN"

// ErrNoToken is returned by TokenFromEnv when no token is configured, so
// that a caller can run without the telegram channel.
var ErrNoToken = errors.New("telegram: no bot token configured (set " + EnvToken + " or " + EnvToken + "_FILE)")

const redacted = "[redacted]"

// Token is a bot token, a credential. It prints, logs and marshals as
// "[redacted]"; use string(t) to read the value.
type Token string

// String returns "[redacted]".
func (Token) String() string { return redacted }

// GoString returns "[redacted]" (for %#v).
func (Token) GoString() string { return redacted }

// LogValue implements slog.LogValuer: a Token logs as "[redacted]".
func (Token) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText implements encoding.TextMarshaler: a Token marshals (to JSON,
// too) as "[redacted]".
func (Token) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// TokenFromEnv reads the bot token through getenv (os.Getenv in a program):
// from EnvToken, or from the file named by EnvToken+"_FILE". Surrounding
// white space is trimmed. It returns ErrNoToken when neither is set, and an
// error naming the variable (never its value) when both are set or the file
// cannot be read or is empty.
func TokenFromEnv(getenv func(string) string) (Token, error) {
	direct := strings.TrimSpace(getenv(EnvToken))
	path := strings.TrimSpace(getenv(EnvToken + "_FILE"))
	switch {
	case direct != "" && path != "":
		return "", fmt.Errorf("telegram: set only one of %s and %s_FILE", EnvToken, EnvToken)
	case direct != "":
		return Token(direct), nil
	case path == "":
		return "", ErrNoToken
	}
	b, err := os.ReadFile(path)
	if err != nil {
		switch {
		case errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("telegram: %s_FILE: file does not exist", EnvToken)
		case errors.Is(err, os.ErrPermission):
			return "", fmt.Errorf("telegram: %s_FILE: permission denied", EnvToken)
		}
		return "", fmt.Errorf("telegram: %s_FILE: cannot read the file", EnvToken)
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		return "", fmt.Errorf("telegram: %s_FILE: the file is empty", EnvToken)
	}
	return Token(tok), nil
}
