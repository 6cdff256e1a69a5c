package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/keel-dev/keel/internal/netlimit"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// request is a local API call, served by the loop goroutine.
type request struct {
	kind  string // status, volumes, delete-volume, images-in-use, prune-images
	name  string
	grace time.Duration // prune-images
	reply chan response
}

type response struct {
	status int
	body   any
}

// Status is what keel node status shows.
type Status struct {
	Report    report.Report `json:"report"`
	Applied   string        `json:"applied"`
	Newest    string        `json:"newest"`
	GitOK     bool          `json:"gitOK"`
	GitError  string        `json:"gitError,omitempty"`
	LastFetch time.Time     `json:"lastFetch,omitzero"`
	Suspended bool          `json:"suspended"`
	// Operations are the instance operations in flight (started, and
	// their outcome not yet recorded): while there are any, the report
	// does not show where the node is going, only where it is.
	Operations int `json:"operations"`
}

// ImageInfo is one OCI image of keel image list.
type ImageInfo struct {
	nodeexec.ImageInfo
	// InUse says whether an instance of the node runs from it or needs
	// it (such an image is never pruned).
	InUse bool `json:"inUse"`
}

// PruneResult is what keel image prune did.
type PruneResult struct {
	Removed []nodeexec.ImageInfo `json:"removed"`
	// Layers counts the cached files removed: layers and artifacts.
	Layers int   `json:"layers"`
	Freed  int64 `json:"freed"`
}

// VolumeInfo is one volume of keel volume list.
type VolumeInfo struct {
	Name      string `json:"name"`
	MountedBy string `json:"mountedBy,omitempty"`
}

func (req request) handle(ctx context.Context, a *Agent) {
	switch req.kind {
	case "status":
		st := Status{Report: a.ownReport(ctx, a.opts.Now()), Applied: a.appliedCommit(), Newest: a.tip,
			GitOK: a.gitOK, GitError: a.gitErr, LastFetch: a.lastFetchOK, Suspended: a.cluster.Suspend,
			Operations: a.rec.InFlight()}
		st.Report.APIVersion, st.Report.Kind = render.APIVersion, report.Kind
		if a.plan != nil {
			st.Report.PlanID = a.plan.PlanID
		}
		req.reply <- response{http.StatusOK, st}
	case "volumes":
		_, vols, err := a.rec.Status(ctx)
		if err != nil {
			req.reply <- response{http.StatusInternalServerError, errBody(err)}
			return
		}
		mounted := map[string]string{}
		for name, st := range a.rec.Instances() {
			if st.State != report.StateRunning {
				continue
			}
			for _, v := range st.Spec.Volumes {
				mounted[v.Name] = name
			}
		}
		out := []VolumeInfo{}
		for _, v := range vols {
			out = append(out, VolumeInfo{Name: v.Name, MountedBy: mounted[v.Name]})
		}
		slices.SortFunc(out, func(x, y VolumeInfo) int { return compare(x.Name, y.Name) })
		req.reply <- response{http.StatusOK, out}
	case "images-in-use":
		req.reply <- response{http.StatusOK, a.rec.ImagesInUse()}
	case "prune-images":
		reply := req.reply
		err := a.rec.PruneImages(req.grace, func(res nodeexec.PruneResult, err error) {
			if err != nil {
				reply <- response{http.StatusInternalServerError, errBody(err)}
				return
			}
			out := PruneResult{Removed: res.Removed, Layers: res.Layers, Freed: res.Freed}
			if out.Removed == nil {
				out.Removed = []nodeexec.ImageInfo{}
			}
			reply <- response{http.StatusOK, out}
		})
		switch {
		case errors.Is(err, nodeexec.ErrPruning):
			req.reply <- response{http.StatusConflict, errBody(err)}
		case err != nil:
			req.reply <- response{http.StatusBadRequest, errBody(err)}
		}
	case "delete-volume":
		if err := render.CheckName(req.name); err != nil {
			req.reply <- response{http.StatusBadRequest, errBody(err)}
			return
		}
		err := a.rec.DeleteVolume(ctx, req.name)
		switch {
		case errors.Is(err, nodeexec.ErrBusy):
			req.reply <- response{http.StatusConflict, errBody(err)}
		case errors.Is(err, nodeexec.ErrNotFound):
			req.reply <- response{http.StatusNotFound, errBody(fmt.Errorf("volume %s does not exist on node %s", req.name, a.opts.Node))}
		case err != nil:
			req.reply <- response{http.StatusInternalServerError, errBody(err)}
		default:
			a.log.Warn("volume deleted for good", "volume", req.name)
			req.reply <- response{http.StatusOK, map[string]string{"deleted": req.name}}
		}
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func errBody(err error) map[string]string { return map[string]string{"error": err.Error()} }

// ServeSocket serves the local API on a Unix socket (mode 0600: only the
// agent's user may call it) until ctx ends.
func (a *Agent) ServeSocket(ctx context.Context, path string) error {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	call := func(w http.ResponseWriter, r *http.Request, req request) {
		req.reply = make(chan response, 1)
		select {
		case a.requests <- req:
		case <-r.Context().Done():
			return
		case <-ctx.Done():
			http.Error(w, "agent stopping", http.StatusServiceUnavailable)
			return
		}
		res := <-req.reply
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(res.status)
		_ = json.NewEncoder(w).Encode(res.body)
	}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { call(w, r, request{kind: "status"}) })
	mux.HandleFunc("GET /v1/volumes", func(w http.ResponseWriter, r *http.Request) { call(w, r, request{kind: "volumes"}) })
	mux.HandleFunc("GET /v1/images", func(w http.ResponseWriter, r *http.Request) {
		// The images are listed here, off the loop (the driver's
		// listing may be slow); the loop says which are in use.
		store, ok := a.opts.Driver.(nodeexec.ImageStore)
		if !ok {
			http.Error(w, fmt.Sprintf("the %s driver keeps no OCI images", a.opts.Driver.Name()), http.StatusNotImplemented)
			return
		}
		images, err := store.Images(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req := request{kind: "images-in-use", reply: make(chan response, 1)}
		select {
		case a.requests <- req:
		case <-r.Context().Done():
			return
		case <-ctx.Done():
			http.Error(w, "agent stopping", http.StatusServiceUnavailable)
			return
		}
		inUse, _ := (<-req.reply).body.([]string)
		out := []ImageInfo{}
		for _, img := range images {
			out = append(out, ImageInfo{ImageInfo: img, InUse: slices.Contains(inUse, img.Digest)})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("POST /v1/images/prune", func(w http.ResponseWriter, r *http.Request) {
		grace := time.Duration(0)
		if g := r.URL.Query().Get("grace"); g != "" {
			d, err := time.ParseDuration(g)
			if err != nil || d < 0 {
				http.Error(w, "grace: a duration, not negative", http.StatusBadRequest)
				return
			}
			grace = d
		}
		call(w, r, request{kind: "prune-images", grace: grace})
	})
	mux.HandleFunc("DELETE /v1/volumes/{name}", func(w http.ResponseWriter, r *http.Request) {
		call(w, r, request{kind: "delete-volume", name: r.PathValue("name")})
	})
	srv := SocketLimits.Server(mux)
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err = srv.Serve(netlimit.Listener(l, SocketLimits.MaxConns))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
