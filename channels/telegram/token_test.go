package telegram

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestToken_Redacts(t *testing.T) {
	opts := Options{Token: testToken, BaseURL: "https://api.telegram.org"}
	var buf syncBuffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "token", opts.Token, "opts", opts)
	js, err := json.Marshal(struct{ Token Token }{opts.Token})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprint(opts), fmt.Sprintf("%+v", opts), fmt.Sprintf("%#v", opts),
		fmt.Sprintf("%s", opts.Token), //lint:ignore S1025 the %s verb is what is tested
		fmt.Sprintf("%q", opts.Token), string(js), buf.String(),
	} {
		if strings.Contains(s, testToken) || strings.Contains(s, "AAH-test") {
			t.Errorf("token leaked in %q", s)
		}
	}
	if !strings.Contains(string(js), "[redacted]") || !strings.Contains(buf.String(), "[redacted]") {
		t.Errorf("want [redacted] in %s and %s", js, buf.String())
	}
}

func TestTokenFromEnv(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
		noToken bool
	}{
		{name: "Direct", env: map[string]string{EnvToken: " " + testToken + " "}},
		{name: "File", env: map[string]string{EnvToken + "_FILE": file}},
		{name: "Nothing", env: map[string]string{}, noToken: true},
		{name: "Both", env: map[string]string{EnvToken: testToken, EnvToken + "_FILE": file}, wantErr: "set only one"},
		{name: "MissingFile", env: map[string]string{EnvToken + "_FILE": filepath.Join(dir, "nope")}, wantErr: EnvToken + "_FILE: file does not exist"},
		{name: "EmptyFile", env: map[string]string{EnvToken + "_FILE": empty}, wantErr: EnvToken + "_FILE: the file is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := TokenFromEnv(func(k string) string { return tc.env[k] })
			switch {
			case tc.noToken:
				if !errors.Is(err, ErrNoToken) {
					t.Errorf("err = %v, want ErrNoToken", err)
				}
			case tc.wantErr == "":
				if err != nil || string(tok) != testToken {
					t.Errorf("TokenFromEnv = %v; want the token", err)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				if err != nil && (strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), dir)) {
					t.Errorf("error %q contains the token or the path", err)
				}
			}
		})
	}
}
