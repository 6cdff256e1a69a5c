package process

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// expandArgs replaces, in each argument, ${NAME} and $NAME by the value of
// NAME in env ("" when unset) and $$ by $. Anything else that follows a $
// ($1, $?, ${x:-y}, a $ at the end) is kept as written, so that a shell
// given the argument still sees its own syntax.
func expandArgs(args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = expand(a, env)
	}
	return out
}

func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch c := s[i+1]; {
		case c == '$':
			b.WriteByte('$')
			i++
		case c == '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 || !isName(s[i+2:i+2+end]) {
				b.WriteByte('$')
				continue
			}
			b.WriteString(env[s[i+2:i+2+end]])
			i += 2 + end
		case isNameStart(c):
			j := i + 2
			for j < len(s) && (isNameStart(s[j]) || '0' <= s[j] && s[j] <= '9') {
				j++
			}
			b.WriteString(env[s[i+1:j]])
			i = j - 1
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func isNameStart(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isName(s string) bool {
	if s == "" || !isNameStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isNameStart(s[i]) && (s[i] < '0' || s[i] > '9') {
			return false
		}
	}
	return true
}

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
// made writable by their owner so that Destroy can remove them.
func copyTree(src, dst string) error {
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
			return os.Mkdir(target, mode.Perm()|0o700)
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
