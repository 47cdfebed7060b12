package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/outboxhq/outbox/queue/filestore"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/render"
)

// settings binds flags to OUTBOX_* environment variables: the variable
// gives the default, the flag overrides it, and -help lists both.
type settings struct {
	fs   *flag.FlagSet
	e    *env
	errs []string
}

func newSettings(name string, e *env) *settings {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &settings{fs: fs, e: e}
}

func (s *settings) usage(h string) {
	s.fs.Usage = func() { fmt.Fprint(s.fs.Output(), h); s.fs.PrintDefaults() }
}

func (s *settings) str(name, envName, def, help string) *string {
	return s.fs.String(name, envOr(s.e, envName, def), fmt.Sprintf("%s (env %s)", help, envName))
}

func (s *settings) boolean(name, envName string, def bool, help string) *bool {
	v := def
	if raw := s.e.Getenv(envName); raw != "" {
		b, err := strconv.ParseBool(raw)
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("%s=%q is not a boolean", envName, raw))
		}
		v = b
	}
	return s.fs.Bool(name, v, fmt.Sprintf("%s (env %s)", help, envName))
}

func (s *settings) integer(name, envName string, def int, help string) *int {
	v := def
	if raw := s.e.Getenv(envName); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("%s=%q is not an integer", envName, raw))
		}
		v = n
	}
	return s.fs.Int(name, v, fmt.Sprintf("%s (env %s)", help, envName))
}

func (s *settings) duration(name, envName string, def time.Duration, help string) *time.Duration {
	v := def
	if raw := s.e.Getenv(envName); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("%s=%q is not a duration (e.g. 30s, 5m)", envName, raw))
		}
		v = d
	}
	return s.fs.Duration(name, v, fmt.Sprintf("%s (env %s)", help, envName))
}

// parse parses args; it reports environment errors as usage errors.
func (s *settings) parse(args []string) (int, bool) {
	if code, done := parseFlags(s.fs, s.e, args); done {
		return code, true
	}
	if len(s.errs) > 0 {
		for _, m := range s.errs {
			fmt.Fprintln(s.e.Stderr, "Error:", m)
		}
		return exitUsage, true
	}
	return 0, false
}

// secret reads a secret from the environment variable name, or from the
// file named by name_FILE. Secrets never come from flags (they would show
// in ps). It returns "" when neither is set.
func secret(e *env, name string) (string, error) {
	v, file := strings.TrimSpace(e.Getenv(name)), strings.TrimSpace(e.Getenv(name+"_FILE"))
	switch {
	case v != "" && file != "":
		return "", fmt.Errorf("set only one of %s and %s_FILE", name, name)
	case v != "":
		return v, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read %s_FILE: %w", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

// dataFlag adds the --data flag every store command has.
func dataFlag(s *settings) *string {
	return s.str("data", "OUTBOX_DATA", "./data", "data directory")
}

// logRewriteFlag adds --log-rewrite-min (serve and compact prune).
func logRewriteFlag(s *settings) *int {
	return s.integer("log-rewrite-min", "OUTBOX_LOG_REWRITE_MIN", filestore.DefaultLogRewriteMin,
		"file store: a log whose pruned records fill half of it is rewritten without them from this size in bytes (-1 = never)")
}

// tenantFlag adds the --tenant flag.
func tenantFlag(s *settings) *string {
	return s.str("tenant", "OUTBOX_TENANT", "default", "tenant")
}

// brandFlags are the branding settings serve and render share.
type brandFlags struct {
	name, sender, color, logo, address, prefs *string
}

// brandFlagNames names each render.Brand field's flag and variable, for
// errors.
var brandFlagNames = map[string]string{
	"Name":           "--brand-name (OUTBOX_BRAND_NAME)",
	"SenderName":     "--brand-sender (OUTBOX_BRAND_SENDER)",
	"Color":          "--brand-color (OUTBOX_BRAND_COLOR)",
	"LogoURL":        "--brand-logo-url (OUTBOX_BRAND_LOGO_URL)",
	"Address":        "--brand-address (OUTBOX_BRAND_ADDRESS)",
	"PreferencesURL": "--brand-preferences-url (OUTBOX_BRAND_PREFERENCES_URL)",
}

// addBrandFlags adds the --brand-* flags (docs/branding.md).
func addBrandFlags(s *settings) *brandFlags {
	return &brandFlags{
		name:    s.str("brand-name", "OUTBOX_BRAND_NAME", render.DefaultProductName, "product name in e-mails, notifications and the unsubscribe pages"),
		sender:  s.str("brand-sender", "OUTBOX_BRAND_SENDER", "", "display name of the e-mails' From (default: the name in --email-from, else --brand-name)"),
		color:   s.str("brand-color", "OUTBOX_BRAND_COLOR", render.DefaultBrandColor, "brand colour, #rrggbb or #rgb (buttons; links when readable on white)"),
		logo:    s.str("brand-logo-url", "OUTBOX_BRAND_LOGO_URL", "", "https URL of a logo atop e-mails and the unsubscribe pages"),
		address: s.str("brand-address", "OUTBOX_BRAND_ADDRESS", "", "postal address line in every e-mail's footer (CAN-SPAM requires one in commercial e-mail)"),
		prefs:   s.str("brand-preferences-url", "OUTBOX_BRAND_PREFERENCES_URL", "", "http(s) URL where users manage what they get: e-mail footers, the digest's button, the unsubscribe pages"),
	}
}

// brand returns the checked brand, or an error naming the flag whose
// value is refused (never repeating the value).
func (b *brandFlags) brand() (render.Brand, error) {
	br, err := render.Brand{Name: *b.name, SenderName: *b.sender, Color: *b.color, LogoURL: *b.logo, Address: *b.address, PreferencesURL: *b.prefs}.Normalize()
	var be *render.BrandError
	if errors.As(err, &be) {
		return render.Brand{}, fmt.Errorf("%s %s", brandFlagNames[be.Field], be.Problem)
	}
	return br, err
}
