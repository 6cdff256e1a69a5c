package freebsd

// The driver's durable records, under <StateDir>/freebsd/:
//
//	network.json                 the aliases and routes Keel added, the next
//	                             epair ordinal, and the boot they belong to
//	instances/<name>/record.json what an instance was started with: its spec
//	                             hash, epair ordinal, address, volumes, the
//	                             identity of its workload and its environment
//	instances/<name>/stdout.log  its output (see package logfile)
//	instances/<name>/stderr.log
//
// The records are what make an agent restarted at any moment remove only
// what Keel added: a route or alias is written down before the command that
// adds it, and forgotten after the command that removes it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/keel-dev/keel/nodeexec"
)

// instanceRecord is what the driver knows of an instance beyond what the
// host shows.
type instanceRecord struct {
	Instance string `json:"instance"`
	SpecHash string `json:"specHash"`
	// Bridge, Epair and Address are set once the instance's network is
	// (being) attached: epair<Epair>a on Bridge, Address (with its
	// prefix) on epair<Epair>b in the jail.
	Bridge  string `json:"bridge,omitempty"`
	Epair   int    `json:"epair,omitempty"`
	Address string `json:"address,omitempty"`
	// Leader is the workload's first process, started by jexec.
	Leader *leader `json:"leader,omitempty"`
	// Env is the workload's environment (NAME=value), which its exec
	// checks get too (Exec). Absent from records of older agents.
	Env []string `json:"env,omitempty"`
}

// leader identifies a process for good: a PID and its start time.
type leader struct {
	PID   int   `json:"pid"`
	Start int64 `json:"start"` // Unix seconds, as ps -o lstart shows it
}

// netRecord is the node-wide network state Keel added.
type netRecord struct {
	// BootTime is kern.boottime's seconds when the record was last
	// checked: aliases and routes do not survive a reboot.
	BootTime  int64         `json:"bootTime"`
	NextEpair int           `json:"nextEpair"`
	Aliases   []aliasRecord `json:"aliases,omitempty"`
	Routes    []routeRecord `json:"routes,omitempty"`
}

// aliasRecord is an address Keel added to a bridge: a jail subnet's
// gateway (prefix /24) or a VIP (/32).
type aliasRecord struct {
	Iface string `json:"iface"`
	Addr  string `json:"addr"` // a prefix: 10.0.60.1/24, 10.96.0.5/32
	VIP   bool   `json:"vip,omitempty"`
	// Pending is set from just before the command that adds it until it
	// succeeded.
	Pending bool `json:"pending,omitempty"`
}

// routeRecord is a kernel route Keel added.
type routeRecord struct {
	Dest string `json:"dest"`
	Via  string `json:"via"`
	// Pending: as for aliasRecord.
	Pending bool `json:"pending,omitempty"`
}

func (d *Driver) recordPath(instance string) string {
	return filepath.Join(d.instanceDir(instance), "record.json")
}

func (d *Driver) netPath() string { return filepath.Join(d.state, "network.json") }

// loadRecords reads every instance's record.
func (d *Driver) loadRecords() error {
	entries, err := os.ReadDir(filepath.Join(d.state, "instances"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() || checkName("instance", e.Name()) != nil {
			continue
		}
		b, err := os.ReadFile(d.recordPath(e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		var r instanceRecord
		if err := json.Unmarshal(b, &r); err != nil || r.Instance != e.Name() {
			d.log.Warn("ignoring an unreadable instance record", "instance", e.Name(), "err", err)
			continue
		}
		d.records[r.Instance] = &r
	}
	return nil
}

// record returns a copy of an instance's record, or nil.
func (d *Driver) record(instance string) *instanceRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.records[instance]
	if r == nil {
		return nil
	}
	c := *r
	if r.Leader != nil {
		l := *r.Leader
		c.Leader = &l
	}
	return &c
}

// saveRecord writes an instance's record durably, then keeps it.
func (d *Driver) saveRecord(r *instanceRecord) error {
	if err := os.MkdirAll(d.instanceDir(r.Instance), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := nodeexec.WriteFileAtomic(d.recordPath(r.Instance), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("recording instance %s: %w", r.Instance, err)
	}
	c := *r
	d.mu.Lock()
	d.records[r.Instance] = &c
	d.mu.Unlock()
	return nil
}

// forget removes an instance's record and logs: its end.
func (d *Driver) forget(instance string) error {
	if err := os.RemoveAll(d.instanceDir(instance)); err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.records, instance)
	d.mu.Unlock()
	return nil
}

// loadNet reads network.json and checks it against the boot it was written
// in.
func (d *Driver) loadNet(ctx context.Context) error {
	b, err := os.ReadFile(d.netPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &d.net); err != nil {
			return fmt.Errorf("%s: %w", d.netPath(), err)
		}
	}
	d.net.NextEpair = max(d.net.NextEpair, 1) // ordinals start at 1 (docs/freebsd-notes.md §0)
	for _, r := range d.records {
		d.net.NextEpair = max(d.net.NextEpair, r.Epair+1)
	}
	boot, err := d.bootTime(ctx)
	if err != nil {
		// Without it a reboot cannot be told; keeping the records is the
		// safe side: a forgotten route would never be removed.
		d.log.Warn("reading kern.boottime; keeping the network records as they are", "err", err)
		return nil
	}
	if d.net.BootTime != 0 && d.net.BootTime != boot && (len(d.net.Aliases) > 0 || len(d.net.Routes) > 0) {
		d.log.Info("the host rebooted: its aliases and routes are gone, forgetting them", "aliases", len(d.net.Aliases), "routes", len(d.net.Routes))
		d.net.Aliases, d.net.Routes = nil, nil
	}
	d.net.BootTime = boot
	return d.saveNetLocked()
}

// saveNetLocked writes network.json durably; d.netMu is held (or d is not
// yet shared).
func (d *Driver) saveNetLocked() error {
	b, err := json.MarshalIndent(&d.net, "", "  ")
	if err != nil {
		return err
	}
	if err := nodeexec.WriteFileAtomic(d.netPath(), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("recording the network: %w", err)
	}
	return nil
}

// bootTime reads kern.boottime's seconds.
func (d *Driver) bootTime(ctx context.Context) (int64, error) {
	out, err := d.must(ctx, "sysctl", "-n", "kern.boottime")
	if err != nil {
		return 0, err
	}
	return parseBootTime(out)
}
