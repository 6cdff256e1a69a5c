package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// deletingPrefix marks a volume being deleted: it is renamed first, so a
// crash half-way through never leaves a half-deleted volume under its name.
const deletingPrefix = ".deleting-"

// EnsureVolume creates volumes/<name> (mode 0700) when missing and returns
// its path. The size is not enforced: a volume is a plain directory, which
// may grow until the file system is full.
func (d *Driver) EnsureVolume(ctx context.Context, name string, size render.Bytes) (string, error) {
	if err := checkName("volume", name); err != nil {
		return "", err
	}
	path := d.volumeDir(name)
	err := os.Mkdir(path, 0o700)
	if errors.Is(err, fs.ErrExist) {
		fi, serr := os.Stat(path)
		if serr == nil && fi.IsDir() {
			return path, nil
		}
		return "", fmt.Errorf("volume %s: %s exists and is not a directory", name, path)
	}
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", name, err)
	}
	return path, nil
}

// Volumes lists the volumes, sorted.
func (d *Driver) Volumes(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, "volumes"))
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && checkName("volume", e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// DeleteVolume removes a volume and its data. It returns an error wrapping
// nodeexec.ErrNotFound when there is no such volume and nodeexec.ErrBusy
// while a running instance was started with it (its KEEL_VOLUME_* names the
// volume's path).
func (d *Driver) DeleteVolume(ctx context.Context, name string) error {
	if err := checkName("volume", name); err != nil {
		return err
	}
	unlock := d.names.Lock("volume/" + name)
	defer unlock()
	path := d.volumeDir(name)
	if fi, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
		return fmt.Errorf("volume %s: %w", name, nodeexec.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	running, err := d.running(ctx)
	if err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	for _, inst := range slices.Sorted(maps.Keys(running)) {
		if slices.Contains(running[inst].volumes, path) {
			return fmt.Errorf("volume %s: instance %s runs with it: %w", name, inst, nodeexec.ErrBusy)
		}
	}
	doomed := filepath.Join(d.root, "volumes", deletingPrefix+name+"-"+strconv.FormatInt(d.now().UnixNano(), 36))
	if err := os.Rename(path, doomed); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	if err := removeTree(doomed); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	return nil
}

// removeDeleted finishes deletions that a crash interrupted.
func (d *Driver) removeDeleted() error {
	dir := filepath.Join(d.root, "volumes")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("process driver: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), deletingPrefix) {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("process driver: finishing a volume deletion: %w", err)
			}
		}
	}
	return nil
}
