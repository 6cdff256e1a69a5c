package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's starttime. Linux
// fixes it at 100 in its ABI on every architecture Keel runs on, so it is
// not read with sysconf (which would need cgo).
const clockTicks = 100

// procStat is what the driver needs from /proc/<pid>/stat.
type procStat struct {
	State     byte   // field 3: R, S, D, Z, X, ...
	PPID      int    // field 4
	PGID      int    // field 5
	StartTime uint64 // field 22: clock ticks after boot
}

// alive reports whether the process still runs: a zombie (or a dead task
// not yet gone from /proc) has exited, even though its PID still exists.
func (s procStat) alive() bool { return s.State != 'Z' && s.State != 'X' }

// parseStat parses the contents of /proc/<pid>/stat. The second field is
// the command name in parentheses, which may itself hold spaces,
// parentheses and newlines, so the fixed fields are read after the last ')'.
func parseStat(b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 || bytes.IndexByte(b, '(') < 0 {
		return procStat{}, errors.New("stat: no command name in parentheses")
	}
	// fields[0] is field 3 (state), so field n is fields[n-3].
	fields := strings.Fields(string(b[end+1:]))
	if len(fields) < 22-3+1 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command name, want at least %d", len(fields), 22-3+1)
	}
	if len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("stat: state %q is not one letter", fields[0])
	}
	ppid, err := strconv.Atoi(fields[4-3])
	if err != nil {
		return procStat{}, fmt.Errorf("stat: ppid: %w", err)
	}
	pgid, err := strconv.Atoi(fields[5-3])
	if err != nil {
		return procStat{}, fmt.Errorf("stat: pgrp: %w", err)
	}
	start, err := strconv.ParseUint(fields[22-3], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("stat: starttime: %w", err)
	}
	return procStat{State: fields[0][0], PPID: ppid, PGID: pgid, StartTime: start}, nil
}

// readStat reads and parses /proc/<pid>/stat; the error satisfies
// errors.Is(err, fs.ErrNotExist) when the process is gone.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// isAlive reports whether the process identified by pid and start time
// still runs (not a zombie, and not a newer process that reused the PID).
func isAlive(pid int, start uint64) bool {
	st, err := readStat(pid)
	return err == nil && st.alive() && st.StartTime == start
}

// marker is what the driver reads back from a process's environment to
// recognise it as one of its instances.
type marker struct {
	Root     string   // KEEL_DRIVER_ROOT
	Instance string   // KEEL_INSTANCE
	SpecHash string   // KEEL_SPEC_HASH
	Volumes  []string // the values of KEEL_VOLUME_*: host paths
}

// parseEnviron reads the Keel variables out of the contents of
// /proc/<pid>/environ (NUL-separated NAME=value pairs). As getenv(3) does,
// the first definition of a name wins.
func parseEnviron(b []byte) marker {
	var m marker
	seen := map[string]bool{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		name, value, ok := bytes.Cut(kv, []byte{'='})
		if !ok || !bytes.HasPrefix(name, []byte("KEEL_")) || seen[string(name)] {
			continue
		}
		seen[string(name)] = true
		switch n := string(name); {
		case n == envDriverRoot:
			m.Root = string(value)
		case n == envInstance:
			m.Instance = string(value)
		case n == envSpecHash:
			m.SpecHash = string(value)
		case strings.HasPrefix(n, envVolumePrefix):
			m.Volumes = append(m.Volumes, string(value))
		}
	}
	return m
}

// parseMemTotal returns MemTotal from the contents of /proc/meminfo, in
// bytes.
func parseMemTotal(b []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("meminfo: MemTotal line %q is not \"<n> kB\"", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb <= 0 || kb > 1<<52 {
			return 0, fmt.Errorf("meminfo: MemTotal %q is not a size", f[0])
		}
		return kb << 10, nil
	}
	return 0, errors.New("meminfo: no MemTotal line")
}

// parseBootTime returns the btime line of /proc/stat: when the system
// booted, which turns a process's starttime into a wall-clock time.
func parseBootTime(b []byte) (time.Time, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20) // the intr line is long on machines with many IRQs
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "btime ")
		if !ok {
			continue
		}
		sec, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		if err != nil || sec <= 0 {
			return time.Time{}, fmt.Errorf("stat: btime %q is not a time", rest)
		}
		return time.Unix(sec, 0), nil
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("stat: %w", err)
	}
	return time.Time{}, errors.New("stat: no btime line")
}
