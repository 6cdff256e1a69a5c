package process

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// lookPath resolves argv[0]: with a slash, an absolute path is used as is
// and a relative one is relative to root; without one, it is searched in
// pathList (the instance's PATH, whose relative entries are relative to
// root).
func lookPath(file, pathList, root string) (string, error) {
	if strings.Contains(file, "/") {
		if filepath.IsAbs(file) {
			return file, nil
		}
		return filepath.Join(root, file), nil
	}
	if file == "" {
		return "", errors.New("the command's first element is empty")
	}
	for _, dir := range filepath.SplitList(pathList) {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(root, dir)
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: not found in the instance's PATH", file)
}

// copyTree copies the directory src to dst, which must not exist:
// directories, regular files with their permissions, and symbolic links as
// they are (an image is the node's own, trusted content). Directories are
// made writable by their owner so that Destroy can remove them. With
// link, files are hard links to src's rather than copies, and
// directories keep their owners.
func copyTree(src, dst string, link bool) error {
	return filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(target, mode.Perm()|0o700); err != nil || !link {
				return err
			}
			return chownLike(target, info)
		case mode.IsRegular() && link:
			return os.Link(path, target)
		case mode.IsRegular():
			return copyFile(path, target, mode.Perm())
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		default:
			return nil // devices, sockets, pipes: not part of an image
		}
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// removeTree removes path and everything under it, also when an instance
// left directories without write permission.
func removeTree(path string) error {
	err := os.RemoveAll(path)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(path, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}

// chownLike gives path info's owner, when running as root.
func chownLike(path string, info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(path, int(st.Uid), int(st.Gid))
}
