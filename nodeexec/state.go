package nodeexec

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// stateVersion is the format of state.json; a newer format is refused.
const stateVersion = 1

// State is what the reconciler must remember across crashes: what it
// started, with which spec, and the restart history. What actually runs is
// always read back from the driver; the state only adds to it.
type State struct {
	Version   int                       `json:"version"`
	Instances map[string]*InstanceState `json:"instances"`
}

// InstanceState is one instance this node holds.
type InstanceState struct {
	Service  string          `json:"service,omitempty"`
	Address  string          `json:"address"`
	SpecHash string          `json:"specHash"`
	Spec     render.JailSpec `json:"spec"`
	// PID and StartTime identify the process last started or adopted.
	PID       int          `json:"pid,omitempty"`
	StartTime uint64       `json:"startTime,omitempty"`
	Started   time.Time    `json:"started,omitzero"`
	State     report.State `json:"state"`
	Restarts  int          `json:"restarts"`
	// Backoff is the delay before the next restart after a crash; it
	// doubles up to maxBackoff and resets after resetAfter of uptime.
	Backoff     time.Duration `json:"backoff,omitempty"`
	NextRestart time.Time     `json:"nextRestart,omitzero"`
	LastExit    *ExitRecord   `json:"lastExit,omitempty"`
	Error       string        `json:"error,omitempty"`
	// Generation is the copy's generation as the plan gave it when it was
	// started (planner.Placement.Generation), reported so that of two
	// copies the newer keeps the instance.
	Generation int `json:"generation,omitempty"`
	// SpecSince is when the instance was first started at SpecHash on
	// this node (its restarts after a crash keep it): a replica not ready
	// within its Service's progressDeadline of it fails the rollout.
	SpecSince time.Time `json:"specSince,omitzero"`
	// ProvenHash is the spec hash the instance was last seen ready at
	// (Reconciler.Proven): at that hash its report carries no specSince,
	// so that a later crash is not taken for a rollout that failed.
	ProvenHash string `json:"provenHash,omitempty"`
}

// ExitRecord is the last exit of an instance.
type ExitRecord struct {
	Code  int       `json:"code"`
	Known bool      `json:"known"`
	At    time.Time `json:"at"`
}

// stateFile is the name of the state file in the state directory.
const stateFile = "state.json"

// LoadState reads the state file in dir; a missing file is an empty state.
func LoadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return &State{Version: stateVersion, Instances: map[string]*InstanceState{}}, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", stateFile, err)
	}
	if s.Version > stateVersion {
		return nil, fmt.Errorf("%s has format %d, newer than this agent's %d: run a newer keel", stateFile, s.Version, stateVersion)
	}
	if s.Instances == nil {
		s.Instances = map[string]*InstanceState{}
	}
	s.Version = stateVersion
	return &s, nil
}

// WriteFileAtomic replaces path with data, durably.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func parseAddr(s string) (netip.Addr, error) { return netip.ParseAddr(s) }
