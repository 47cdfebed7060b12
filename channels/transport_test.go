package channels

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// ClassifyTransport tells a call that never reached the service (nothing
// sent: safe to retry for any provider) from one that may have, on the
// errors net/http really returns, and keeps the URL out of the error.
func TestClassifyTransport(t *testing.T) {
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}()
	cut, err := net.Listen("tcp", "127.0.0.1:0") // reads the request, then hangs up
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	go func() {
		for {
			c, err := cut.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 4096))
			c.Close()
		}
	}()
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	defer slow.Close()
	defer close(hang)
	untrusted := httptest.NewTLSServer(http.NotFoundHandler())
	defer untrusted.Close()
	garbage, err := net.Listen("tcp", "127.0.0.1:0") // answers the handshake with bytes that are not TLS
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	go func() {
		for {
			c, err := garbage.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("\x15\x99\x99 not a TLS record"))
			c.Close()
		}
	}()

	post := func(target string, timeout time.Duration) error {
		c := &http.Client{Timeout: timeout}
		resp, err := c.Post(target+"/bot-SECRET/sendMessage", "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("POST %s answered %d", target, resp.StatusCode)
		}
		return err
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want envelope.ErrorClass
	}{
		{"connection refused", post("http://"+closed, time.Second), envelope.ClassUnreachable},
		{"no such host", &url.Error{Op: "Post", URL: "https://api.example.invalid/bot-SECRET", Err: &net.OpError{Op: "dial", Net: "tcp",
			Err: &net.DNSError{Err: "no such host", Name: "api.example.invalid", IsNotFound: true}}}, envelope.ClassUnreachable},
		{"certificate not trusted", post(untrusted.URL, time.Second), envelope.ClassUnreachable},
		{"not a TLS server", post("https://"+garbage.Addr().String(), time.Second), envelope.ClassUnreachable},
		{"cut after the request", post("http://"+cut.Addr().String(), time.Second), envelope.ClassNetwork},
		{"no answer in time", post(slow.URL, 50*time.Millisecond), envelope.ClassTimeout},
		{"cancelled", cancelled.Err(), envelope.ClassTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ClassifyTransport(tc.err)
			var de *envelope.DeliveryError
			if !errors.As(got, &de) || de.Kind != envelope.KindRetryable || de.Class != tc.want {
				t.Fatalf("ClassifyTransport(%v) = %v, want retryable %s", tc.err, got, tc.want)
			}
			if strings.Contains(got.Error(), "SECRET") || strings.Contains(got.Error(), "127.0.0.1") {
				t.Errorf("error %q quotes the URL", got)
			}
		})
	}
}
