package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/render"
)

// The demo's web application is an OCI image on a registry the demo runs
// on 127.0.0.1 (go-containerregistry's, in memory): its etc/version is
// what GET /version answers. keel demo-image builds a new version and
// pushes it, as CI would, and prints the reference to commit.

// demoRepository is the web application's repository on the registry.
const demoRepository = "demo/web"

// demoRegistry is the demo's registry.
type demoRegistry struct {
	host string
	srv  *http.Server
	done chan struct{}
}

func startDemoRegistry() (*demoRegistry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &demoRegistry{host: l.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(l)
	}()
	return r, nil
}

// Close stops the registry and waits for it.
func (r *demoRegistry) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	<-r.done
}

// pushDemoImage builds the web application's image at version (a layer
// with etc/version) and pushes it to the registry at host; it returns
// the spec.image that pins it.
func pushDemoImage(ctx context.Context, host, version string) (string, error) {
	if version == "" || strings.ContainsAny(version, "\n\x00") || len(version) > 64 {
		return "", errors.New("--version: 1 to 64 characters on one line")
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(tarOf(map[string]string{"etc/version": version + "\n"}))), nil
	})
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(host + "/" + demoRepository + ":latest")
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	image := render.OCIPrefix + host + "/" + demoRepository + "@" + d.String()
	if _, err := render.ParseImage(image); err != nil {
		return "", err
	}
	return image, nil
}

func (e *env) demoImageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "demo-image",
		Short:  "Build the demo's web application at a version, push it to the demo's registry and print its reference",
		Hidden: true,
		Args:   cobra.NoArgs,
	}
	reg := cmd.Flags().String("registry", "", "the demo's registry, host:port on 127.0.0.1 (keel demo prints it)")
	version := cmd.Flags().String("version", "", "the version the image's etc/version says")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if host, _, err := net.SplitHostPort(*reg); err != nil || host != "127.0.0.1" {
			return errors.New("--registry: the demo's registry, 127.0.0.1:<port>")
		}
		image, err := pushDemoImage(e.ctx, *reg, *version)
		if err != nil {
			return fmt.Errorf("push to the demo's registry %s: %w", *reg, err)
		}
		fmt.Fprintln(e.stdout, image)
		return nil
	}
	return cmd
}

// tarOf is a tar archive of regular files (mode 0644), in name order.
func tarOf(files map[string]string) string {
	var b strings.Builder
	tw := tar.NewWriter(&b)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := files[name]
		// Writes to a strings.Builder do not fail.
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), Format: tar.FormatPAX})
		_, _ = io.WriteString(tw, body)
	}
	_ = tw.Close()
	return b.String()
}
