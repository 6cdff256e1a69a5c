package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// scalar is implemented by the value types of the spec grammar (sizes, CPU
// amounts, durations, addresses, prefixes). parseScalar receives the scalar's
// text, whatever YAML type it resolved to, and returns a message fit to follow
// the field path when the text is not valid.
type scalar interface {
	parseScalar(text string) error
}

// maxDepth bounds nesting, including through aliases, so that a hostile
// document (an alias that refers to its own ancestor) cannot recurse forever.
// A Keel document needs 8 levels
// (spec.template.checks.liveness.exec.command[0]).
const maxDepth = 32

// msgTooDeep is the one error a document nested deeper than maxDepth gets,
// wherever the nesting is: nothing of such a document is read.
var msgTooDeep = fmt.Sprintf("nested too deeply: more than %d levels (the document is not read)", maxDepth)

// decoder turns a yaml.Node tree into Go values strictly: unknown fields,
// duplicate keys and wrong types are errors with their position, and the
// position of every value decoded is recorded by field path so that later
// checks can point at it.
type decoder struct {
	file  string
	diag  *diagnoser
	pos   map[string]Position
	empty map[string]bool // paths written with an empty value
	depth int
	// refused is set when the document was not decoded at all (it is
	// nested too deeply): its one error has been reported, and its zero
	// value must not be checked further.
	refused bool
}

func (d *decoder) position(n *yaml.Node) Position {
	return Position{File: d.file, Line: n.Line, Column: n.Column}
}

// at returns the position recorded for path, or for its nearest recorded
// parent when the field itself was not written.
func (d *decoder) at(path string) Position {
	for {
		if p, ok := d.pos[path]; ok {
			return p
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			if p, ok := d.pos[""]; ok {
				return p
			}
			return Position{File: d.file}
		}
		path = path[:i]
	}
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	d.diag.decodeErrorf(d.position(n), path, format, args...)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// maxAliased bounds the values that aliases repeat in one document: what
// decoding would visit beyond the document's own nodes. Without a bound,
// a list of a thousand aliases to a mapping of a thousand keys (13 KB)
// would be decoded as a million values, with an error for each.
const maxAliased = 10000

// msgAliased is the one error of a document whose aliases repeat more.
var msgAliased = fmt.Sprintf("aliases repeat more than %d values (the document is not read)", maxAliased)

// shape measures a document before it is decoded: its depth, aliases
// followed, and how much its aliases repeat. The walk never follows an
// alias (an anchored node is measured once, where it is written, and
// every alias to it adds that measure), so it visits each node once and
// recurses at most maxDepth+1 deep, whatever the input.
type shape struct {
	anchored map[*yaml.Node]extent // anchored nodes already measured
	aliased  int                   // values repeated by aliases so far
	bad      *yaml.Node            // where the document is refused
	msg      string
}

type extent struct{ size, height int }

func (s *shape) fail(n *yaml.Node, msg string) extent {
	if s.bad == nil {
		s.bad, s.msg = n, msg
	}
	return extent{}
}

// walk measures n, which is at depth (the document's root is at 1), and
// returns its extent with aliases followed: its number of nodes (capped)
// and its height.
func (s *shape) walk(n *yaml.Node, depth int) extent {
	switch {
	case s.bad != nil:
		return extent{}
	case depth > maxDepth:
		return s.fail(n, msgTooDeep)
	case n.Kind == yaml.AliasNode:
		if n.Alias == nil {
			return extent{1, 1} // the decoder reports it
		}
		e, ok := s.anchored[n.Alias]
		switch {
		case !ok: // an alias inside the node it refers to: endless
			return s.fail(n, msgTooDeep)
		case depth-1+e.height > maxDepth:
			return s.fail(n, msgTooDeep)
		}
		if s.aliased += e.size; s.aliased > maxAliased {
			return s.fail(n, msgAliased)
		}
		return e
	}
	e := extent{1, 1}
	for _, c := range n.Content {
		ce := s.walk(c, depth+1)
		e.size = min(e.size+ce.size, maxAliased+1)
		e.height = max(e.height, ce.height+1)
	}
	if n.Anchor != "" {
		if s.anchored == nil {
			s.anchored = map[*yaml.Node]extent{}
		}
		s.anchored[n] = e
	}
	return e
}

// decodeDocument fills v (addressable) from a document's root node. A
// document nested deeper than maxDepth anywhere, aliases followed, or
// whose aliases repeat more than maxAliased values, gets one error (at the
// first node too deep, or at the alias) and is not decoded at all:
// decoding a deep document would meet a type error (a list where a string
// is expected) long before the depth, and blaming the type would hide what
// is wrong.
func (d *decoder) decodeDocument(root *yaml.Node, v reflect.Value) {
	var s shape
	if s.walk(root, 1); s.bad != nil {
		d.diag.errorf(d.position(s.bad), "", "%s", s.msg)
		d.refused = true
		return
	}
	d.decode(root, v, "")
}

// decode fills v (addressable) from n. An empty value (key:, ~, null) is an
// error here: only a struct field may be left empty (see decodeStruct),
// never a list item or a map value.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > maxDepth {
		d.errorf(n, path, "%s", msgTooDeep)
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.errorf(n, path, "unknown alias")
			return
		}
		d.decode(n.Alias, v, path)
		return
	}
	d.pos[path] = d.position(n)
	if isNull(n) {
		msg := fmt.Sprintf("expected %s, got nothing", expected(v.Type()))
		if v.Kind() == reflect.String {
			msg += ` (write "" for an empty string)`
		}
		d.errorf(n, path, "%s", msg)
		return
	}
	if s, ok := v.Addr().Interface().(scalar); ok {
		if n.Kind != yaml.ScalarNode {
			d.errorf(n, path, "expected a single value, got %s", describe(n))
			return
		}
		if err := s.parseScalar(n.Value); err != nil {
			d.errorf(n, path, "%s", err.Error())
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.decode(n, elem.Elem(), path)
		v.Set(elem)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, path, "expected a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			if n.Kind == yaml.ScalarNode {
				d.errorf(n, path, "expected a string, got %s (quote it: %q)", describe(n), n.Value)
			} else {
				d.errorf(n, path, "expected a string, got %s", describe(n))
			}
			return
		}
		v.SetString(n.Value)
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.errorf(n, path, "expected an integer, got %s", describe(n))
			return
		}
		i, err := strconv.ParseInt(n.Value, 0, 64)
		if err != nil || i != int64(int(i)) {
			d.errorf(n, path, "%q is out of range", n.Value)
			return
		}
		v.SetInt(i)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.errorf(n, path, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(n.Value == "true" || n.Value == "True" || n.Value == "TRUE")
	default:
		panic(fmt.Sprintf("render: cannot decode into %s", v.Type()))
	}
}

// mappingPairs checks that n is a mapping without merge or duplicate keys,
// and returns its key and value nodes. Non-string keys are errors.
func (d *decoder) mappingPairs(n *yaml.Node, path string) (keys, values []*yaml.Node) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "expected a mapping (key: value), got %s", describe(n))
		return nil, nil
	}
	// These errors are about one key; the rest of the mapping is decoded,
	// so they do not silence later checks (diagnoser.undecoded).
	keyErrorf := func(k *yaml.Node, path, format string, args ...any) {
		d.diag.errorf(d.position(k), path, format, args...)
	}
	seen := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			keyErrorf(k, path, "YAML merge keys (<<) are not supported: write the fields out")
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			keyErrorf(k, path, "expected a key, got %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			keyErrorf(k, join(path, k.Value), "duplicate key (first at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		keys = append(keys, k)
		values = append(values, val)
	}
	return keys, values
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// expected names what a value of type t is written as, for messages.
func expected(t reflect.Type) string {
	if reflect.PointerTo(t).Implements(reflect.TypeFor[scalar]()) {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return expected(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Int:
		return "an integer"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice:
		return "a list"
	}
	return "a mapping (key: value)"
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	keys, values := d.mappingPairs(n, path)
	fields := yamlFields(v.Type())
	for i, k := range keys {
		idx, ok := fields[k.Value]
		if !ok {
			names := make([]string, 0, len(fields))
			for name := range fields {
				names = append(names, name)
			}
			msg := fmt.Sprintf("unknown field %q", k.Value)
			if s := suggest(k.Value, names); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.errorf(k, join(path, k.Value), "%s", msg)
			continue
		}
		p, val, field := join(path, k.Value), values[i], v.Field(idx)
		if isNull(val) {
			// A field written empty counts as not written: its default
			// applies, or the check of a required field reports it.
			d.pos[p] = d.position(val)
			if d.empty == nil {
				d.empty = map[string]bool{}
			}
			d.empty[p] = true
			continue
		}
		before := len(d.diag.diags)
		d.decode(val, field, p)
		if def, ok := v.Type().Field(idx).Tag.Lookup("default"); ok && len(d.diag.diags) == before && isEmpty(field) {
			d.errorf(val, p, "%s is not allowed: leave the field out to use the default (%s)", describeEmpty(field), def)
		}
	}
}

// isEmpty reports whether v holds its type's zero: 0, "", or a list or
// mapping with nothing in it.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map:
		return v.Len() == 0
	}
	return v.IsZero()
}

func describeEmpty(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return `""`
	case reflect.Slice:
		return "an empty list"
	case reflect.Map:
		return "an empty mapping"
	}
	return fmt.Sprint(v.Interface())
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	keys, values := d.mappingPairs(n, path)
	m := reflect.MakeMapWithSize(v.Type(), len(keys))
	for i, k := range keys {
		if k.ShortTag() != "!!str" && v.Type().Key().Kind() == reflect.String {
			// Keys like 8080 or true are legal YAML but surprising map keys.
			d.errorf(k, join(path, k.Value), "expected a string key, got %s (quote it: %q)", describe(k), k.Value)
			continue
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		p := join(path, k.Value)
		d.pos[p+"#key"] = d.position(k)
		before := len(d.diag.diags)
		d.decode(values[i], elem, p)
		if len(d.diag.diags) > before {
			continue // reported; an entry with a broken value is left out
		}
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
	}
	v.Set(m)
}

// yamlFields maps each yaml tag name of struct type t to its field index.
func yamlFields(t reflect.Type) map[string]int {
	fields := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			fields[tag] = i
		}
	}
	return fields
}

// describe names the YAML type of n for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "nothing"
	case "!!timestamp":
		return "a timestamp"
	}
	return "a value of type " + n.ShortTag()
}

// suggest returns the candidate closest to s when it is close enough to be a
// likely typo (same letters in another case, or at most two edits away).
func suggest(s string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if strings.EqualFold(c, s) {
			return c
		}
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d < bestDist || (d == bestDist && c < best) {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of neighbours
// each count one, so "wbe" is one edit from "web".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

var yamlErrorLine = regexp.MustCompile(`^yaml: line (\d+): `)

// yamlMessage splits an error of yaml.v3's parser into the line it gives
// (0 when none) and its message.
func yamlMessage(err error) (line int, msg string) {
	msg = err.Error()
	if m := yamlErrorLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		return line, msg[len(m[0]):]
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// yamlSyntaxError returns the position and the message of the error
// yaml.v3 gives when parsing data (the whole of file), and false when data
// parses.
//
// yaml.v3 gives the line where the enclosing block or flow began, and for
// parser errors that line counted from 0, so a key indented wrongly on line
// 10 is reported at line 5 (or 1). The offending character is found
// instead as the end of the shortest prefix of data that fails with the
// same message. Parsing is a single pass: a prefix that includes that
// character fails there, and one that stops before it is the same text cut
// short, which parses or fails with another message (a cut inside an
// unclosed [ or { fails like the unclosed list it is, so that error is
// found where the list opens). The search gallops from the reported line,
// which is never after the offending character, then bisects: O(log n)
// parses of the failing document, and only when a file does not parse.
func yamlSyntaxError(file string, data []byte) (Position, string, bool) {
	err := parseAll(data)
	if err == nil {
		return Position{}, "", false
	}
	line, want := yamlMessage(err)
	msg := "invalid YAML: " + want
	if strings.HasPrefix(want, "exceeded max depth") {
		msg = msgTooDeep // the parser's own limit, far above maxDepth
	}
	pos := Position{File: file, Line: max(line, 1), Column: 1}
	// Documents are parsed independently, so prefixes are parsed from the
	// start of the document holding the reported line, not of the file.
	lo := lineOffset(data, line)
	base := documentStart(data, lo)
	fails := func(n int) bool {
		err := parseAll(data[base:n])
		if err == nil {
			return false
		}
		_, got := yamlMessage(err)
		return got == want
	}
	if !fails(len(data)) {
		base = 0 // a document that needs what came before it
	}
	if lo > base && fails(lo) {
		lo = base // data[base:lo] must not fail
	}
	hi := len(data) // data[base:hi] fails
	for step := 64; lo+step < hi; step *= 2 {
		if fails(lo + step) {
			hi = lo + step
			break
		}
		lo += step
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	pos.Line, pos.Column = lineColumn(data, hi-1)
	return pos, msg, true
}

// parseAll parses every document of data and returns the first error.
func parseAll(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// documentStart returns the offset of the start of the document holding
// the byte at off: the last line starting with the marker --- at or before
// off, or 0.
func documentStart(data []byte, off int) int {
	for start := off; ; start-- {
		start = bytes.LastIndexByte(data[:max(start, 0)], '\n') + 1
		if rest := data[start:]; bytes.HasPrefix(rest, []byte("---")) && (len(rest) == 3 || strings.IndexByte(" \t\r\n", rest[3]) >= 0) {
			return start
		}
		if start == 0 {
			return 0
		}
	}
}

// lineOffset returns the offset of the start of 1-based line in data, or 0
// when data has fewer lines.
func lineOffset(data []byte, line int) int {
	off := 0
	for range line - 1 {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return 0
		}
		off += i + 1
	}
	return off
}

// lineColumn returns the 1-based line and column (counted in characters,
// as yaml.v3 counts them) of the byte at off.
func lineColumn(data []byte, off int) (line, col int) {
	off = max(min(off, len(data)-1), 0)
	start := bytes.LastIndexByte(data[:off], '\n') + 1
	for off > start && !utf8.RuneStart(data[off]) {
		off-- // the last byte of a multi-byte character: count the character
	}
	return bytes.Count(data[:start], []byte{'\n'}) + 1, utf8.RuneCount(data[start:off]) + 1
}
