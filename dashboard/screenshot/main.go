// Command screenshot saves a PNG of a keel dashboard page as a headless
// Chromium shows it: the README's pictures (docs/dashboard.md says how to
// take them again).
//
//	go run ./dashboard/screenshot [-width 1280] [-height 860] [-full] URL OUT.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/keel-dev/keel/dashboard/headless"
)

func main() {
	width := flag.Int("width", 1280, "window width in pixels")
	height := flag.Int("height", 860, "window height in pixels")
	full := flag.Bool("full", false, "the whole page rather than the window")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: screenshot [flags] URL OUT.png")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), flag.Arg(1), *width, *height, *full, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "screenshot:", err)
		os.Exit(1)
	}
}

func run(url, out string, width, height int, full bool, timeout time.Duration) error {
	path, err := headless.Find()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	bctx, stop := headless.Start(ctx, path, width, height)
	defer stop()
	png, err := headless.Screenshot(bctx, url, "#headline", full)
	if err != nil {
		return err
	}
	return os.WriteFile(out, png, 0o644)
}
