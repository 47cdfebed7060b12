package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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

// tenantFlag adds the --tenant flag.
func tenantFlag(s *settings) *string {
	return s.str("tenant", "OUTBOX_TENANT", "default", "tenant")
}
