package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/keel-dev/keel/dashboard"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// TestDashboardServesKeelStatusJSON: the dashboard's /api/status is, byte
// for byte, the document keel status -o json prints for the same status.
func TestDashboardServesKeelStatusJSON(t *testing.T) {
	for _, name := range statustest.Names() {
		t.Run(name, func(t *testing.T) {
			snap, now := statustest.Snapshot(t, name)
			st := status.Compute(status.Input{Snapshot: snap, Now: now})
			var want bytes.Buffer
			if err := writeStatus(&want, st, "json", tableOptions{width: 120}); err != nil {
				t.Fatal(err)
			}
			d, err := dashboard.New(dashboard.Options{
				Source: func(context.Context) (*status.Status, error) { return st, nil },
				Now:    func() time.Time { return now },
			})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			<-d.Loaded()
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/status", nil))
			got, _ := io.ReadAll(rec.Result().Body)
			if rec.Code != http.StatusOK || !bytes.Equal(got, want.Bytes()) {
				t.Errorf("/api/status (%d) differs from keel status -o json:\n%s\nwant:\n%s", rec.Code, got, want.Bytes())
			}
		})
	}
}
