// Command scale runs N simulated Keel nodes in one process against git
// http-backend served on 127.0.0.1 by the harness itself, and measures what
// the git server pays: server CPU per node per minute, fetch and publish
// latency, bytes per fetch, requests per second, missed cycles and the
// repository's growth (docs/benchmarks.md, "Nodes per git server").
//
// Every node publishes with a real sync.Mirror and fetches with another;
// in gossip mode the change notices a node would receive over the gossip
// ring are delivered in-process after a random delay (the simulated part).
//
//	go run ./bench/scale -nodes 300 -mode gossip -duration 3m
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
)

func main() {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("scale", flag.ExitOnError)
	cfg.flags(fs)
	_ = fs.Parse(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		os.Exit(1) // run said why
	}
}
