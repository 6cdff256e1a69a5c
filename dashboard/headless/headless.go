// Package headless drives a headless Chromium for the dashboard's browser
// test and its screenshot tool. It only loads pages it is given; nothing
// in keel imports it but tests and dashboard/screenshot.
package headless

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// Names are the browsers Find looks for in PATH, in order.
var Names = []string{"chromium", "chromium-browser", "headless-shell", "google-chrome"}

// Find returns the path of the first of Names in PATH.
func Find() (string, error) {
	for _, name := range Names {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("none of %v is in PATH (Debian: apt-get install chromium)", Names)
}

// Start starts the browser at path with a window of width × height and
// returns a tab's context; cancel ends the browser and waits for it.
func Start(ctx context.Context, path string, width, height int) (context.Context, context.CancelFunc) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(width, height),
		// /dev/shm is small in containers.
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox (CI runs as
		// root); the pages it loads are keel's own.
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	return bctx, func() {
		bcancel()
		acancel()
	}
}

// Screenshot loads url, waits for the element ready (a CSS selector) to
// be visible, and returns a PNG of the window (of the whole page when
// full).
func Screenshot(ctx context.Context, url, ready string, full bool) ([]byte, error) {
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(ready))); err != nil {
		return nil, err
	}
	if full {
		return chromedp.Run(ctx, chromedp.FullScreenshot(100))
	}
	return chromedp.Run(ctx, chromedp.CaptureScreenshot())
}
