// Command embed-http mounts outbox's HTTP handlers in an app's own mux,
// next to its own routes, with its own sign-in deciding whose push
// subscription a browser saves (docs/embedding.md points here; the test
// drives it).
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
)

func main() {
	dir, err := os.MkdirTemp("", "outbox-embed-http-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	mux, q, err := setup(dir, os.Getenv("INTERNAL_OUTBOX_TOKEN"), "BDemoVapidPublicKey")
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	fmt.Println("listening on http://" + ln.Addr().String())
	log.Fatal(http.Serve(ln, mux))
}

// session stands for the app's own sign-in: a cookie naming the user.
func session(r *http.Request) (string, error) {
	c, err := r.Cookie("session")
	if err != nil || !strings.HasPrefix(c.Value, "u_") {
		return "", errors.New("not signed in")
	}
	return c.Value, nil
}

// setup returns the app's mux and the queue it serves.
func setup(dir, token, vapidPublicKey string) (http.Handler, *filestore.Queue, error) {
	q, err := filestore.Open(dir, nil)
	if err != nil {
		return nil, nil, err
	}
	key, err := httpapi.LoadOrCreateKey(dir) // signs the unsubscribe links
	if err != nil {
		q.Close()
		return nil, nil, err
	}
	api, err := httpapi.New(httpapi.Config{
		Store: q,
		Token: token, // INTERNAL_OUTBOX_TOKEN: /v1 and /internal; "" leaves them unserved
		Unsub: httpapi.NewUnsubscriber(key, "https://app.example.org"),
		// Whose push subscription a browser saves: the app's own sign-in.
		VAPIDPublicKey: vapidPublicKey,
		User: func(r *http.Request) (tenant, user string, err error) {
			user, err = session(r)
			return "", user, err // "" is the default tenant
		},
	})
	if err != nil {
		q.Close()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the app\n") })
	mux.Handle("/unsubscribe/", api)
	mux.Handle("/api/app/push/", api)
	mux.Handle("/v1/", api) // or keep /v1 and /internal off the public listener
	mux.Handle("/internal/", api)
	return mux, q, nil
}
