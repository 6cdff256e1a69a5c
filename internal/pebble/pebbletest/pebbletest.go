//go:build unix

// Package pebbletest starts a Pebble (see package pebble) for a test and
// stops it when the test ends. It builds the binaries once per test
// process, into pebble.DefaultDir, so later runs start at once.
package pebbletest

import (
	stdsync "sync"
	"testing"

	"github.com/keel-dev/keel/internal/pebble"
)

var built struct {
	once          stdsync.Once
	pebble, chall string
	err           error
}

// Binaries returns the pebble and pebble-challtestsrv binaries, building
// them on the first call of the process.
func Binaries(t testing.TB) (pebbleBin, challBin string) {
	t.Helper()
	built.once.Do(func() {
		built.pebble, built.chall, built.err = pebble.Build(pebble.DefaultDir())
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.pebble, built.chall
}

// Start starts a Pebble with opts for t (opts.Dir defaults to a temporary
// directory, the binaries to Binaries') and registers its Close with
// t.Cleanup. When t has failed, the end of both logs is logged.
func Start(t testing.TB, opts pebble.Options) *pebble.Server {
	t.Helper()
	if opts.PebbleBin == "" || opts.ChallBin == "" {
		opts.PebbleBin, opts.ChallBin = Binaries(t)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := pebble.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Log(s.Logs(40))
		}
	})
	return s
}
