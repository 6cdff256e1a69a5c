package dashboard

import (
	"log/slog"
	"net/http"
	"time"
)

// Server limits: a client gets a few seconds to send its headers (no
// request has a body worth waiting for), headers are bounded, and an idle
// connection is closed after a minute.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 16 << 10
)

// NewServer is the http.Server that serves h, with the timeouts and
// header bound the dashboard needs when it faces the network.
func NewServer(h http.Handler, logger *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	if logger != nil {
		srv.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	}
	return srv
}
