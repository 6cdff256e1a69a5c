package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/spf13/cobra"
)

// demoWebCommand is the small HTTP service the demo cluster runs, so that
// nothing but keel itself must be installed. It answers on
// $KEEL_ADDRESS:--port with who it is; with --data it counts requests in a
// file of that directory (a volume), so that the count survives restarts.
func (e *env) demoWebCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "demo-web",
		Short:  "The demo's HTTP service (an instance of the demo cluster runs it)",
		Hidden: true,
		Args:   cobra.NoArgs,
	}
	port := cmd.Flags().Int("port", 8080, "TCP port to listen on, at $KEEL_ADDRESS")
	data := cmd.Flags().String("data", "", "a directory (volume) where the request count is kept")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		addr := os.Getenv("KEEL_ADDRESS")
		if addr == "" {
			addr = "127.0.0.1"
		}
		var mu gosync.Mutex
		hits := 0
		countFile := ""
		if *data != "" {
			countFile = filepath.Join(*data, "hits")
			if b, err := os.ReadFile(countFile); err == nil {
				hits, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits++
			n := hits
			if countFile != "" {
				_ = os.WriteFile(countFile, []byte(strconv.Itoa(n)+"\n"), 0o600)
			}
			mu.Unlock()
			msg := os.Getenv("GREETING")
			if msg == "" {
				msg = "hello"
			}
			fmt.Fprintf(w, "%s from %s on node %s (request %d)\n", msg, os.Getenv("KEEL_INSTANCE"), os.Getenv("KEEL_NODE"), n)
		})
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(*port)))
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			<-e.ctx.Done()
			_ = srv.Close()
		}()
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return cmd
}
