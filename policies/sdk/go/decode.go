package sdk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A hand-written decoder for the requests. encoding/json decodes by
// reflection, which under wazero's compiler cost about 300 us of a Go
// policy's 360 us per call on a 2 KB pod; this decoder reads the same
// fields with the same meaning (null leaves a field unset, keys match
// exactly or else case-insensitively, unknown fields are skipped, the last
// of duplicate keys wins) in a few percent of that. It is used natively too,
// so policies' unit tests see what the module sees.

type decoder struct {
	b []byte
	i int
	// s is b as one string, so that the decoded strings without escapes
	// are substrings of it rather than an allocation each; "" if unset.
	s string
	// escaped says whether the last rawString had escapes (and so is not a
	// slice of b); end is the offset of its closing quote.
	escaped bool
	end     int
}

func newDecoder(b []byte) *decoder { return &decoder{b: b, s: string(b)} }

// text returns the string rawString just returned as raw.
func (d *decoder) text(raw []byte) string {
	if d.escaped || d.s == "" {
		return string(raw)
	}
	return d.s[d.end-len(raw) : d.end]
}

type syntaxError struct {
	msg string
	off int
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at offset %d", e.msg, e.off) }

func (d *decoder) fail(format string, args ...any) error {
	return &syntaxError{fmt.Sprintf(format, args...), d.i}
}

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// null consumes a null and reports whether there was one.
func (d *decoder) null() bool {
	if d.peek() == 'n' && bytes.HasPrefix(d.b[d.i:], []byte("null")) {
		d.i += 4
		return true
	}
	return false
}

// object calls member for each member of an object (or nothing for null);
// member must consume the value.
func (d *decoder) object(member func(key []byte) error) error {
	if d.null() {
		return nil
	}
	if d.peek() != '{' {
		return d.fail("expected an object")
	}
	d.i++
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		if d.peek() != '"' {
			return d.fail("expected a member name")
		}
		key, err := d.rawString(nil)
		if err != nil {
			return err
		}
		if d.peek() != ':' {
			return d.fail("expected ':'")
		}
		d.i++
		if err := member(key); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.fail("expected ',' or '}'")
		}
	}
}

// array calls elem for each element of an array (or nothing for null).
func (d *decoder) array(elem func() error) error {
	if d.null() {
		return nil
	}
	if d.peek() != '[' {
		return d.fail("expected an array")
	}
	d.i++
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.fail("expected ',' or ']'")
		}
	}
}

// rawString reads a string and returns its unescaped bytes: a slice of the
// input if it has no escapes, else appended to buf.
func (d *decoder) rawString(buf []byte) ([]byte, error) {
	if d.peek() != '"' {
		return nil, d.fail("expected a string")
	}
	d.i++
	start := d.i
	d.escaped = false
	for d.i < len(d.b) {
		c := d.b[d.i]
		if c == '"' {
			s := d.b[start:d.i]
			d.end = d.i
			d.i++
			return s, nil
		}
		if c == '\\' {
			d.escaped = true
			return d.escapedString(append(buf, d.b[start:d.i]...))
		}
		if c < 0x20 {
			return nil, d.fail("control character in string")
		}
		d.i++
	}
	return nil, d.fail("unterminated string")
}

func (d *decoder) escapedString(out []byte) ([]byte, error) {
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return out, nil
		case c < 0x20:
			return nil, d.fail("control character in string")
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.b) {
			break
		}
		e := d.b[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return nil, d.fail("invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
					save := d.i
					d.i += 2
					var ok2 bool
					if r2, ok2 = d.hex4(); !ok2 {
						d.i = save
						r2 = -1
					}
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r = dec
				} else {
					if r2 >= 0 {
						d.i -= 6 // not a pair: read the second escape on its own
					}
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, d.fail("invalid escape")
		}
	}
	return nil, d.fail("unterminated string")
}

func (d *decoder) hex4() (rune, bool) {
	if d.i+4 > len(d.b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d.b[d.i:d.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	d.i += 4
	return rune(v), true
}

func (d *decoder) str(dst *string) error {
	if d.null() {
		return nil
	}
	s, err := d.rawString(nil)
	if err != nil {
		return err
	}
	*dst = d.text(s)
	return nil
}

// Slices and maps follow encoding/json: null clears them, [] and {} leave
// them empty but not nil, elements replace what was there.

func (d *decoder) strings(dst *[]string) error {
	if d.null() {
		*dst = nil
		return nil
	}
	if *dst == nil {
		*dst = []string{}
	} else {
		*dst = (*dst)[:0]
	}
	return d.array(func() error {
		var s string
		if err := d.str(&s); err != nil {
			return err
		}
		*dst = append(*dst, s)
		return nil
	})
}

func (d *decoder) stringMap(dst *map[string]string) error {
	if d.null() {
		*dst = nil
		return nil
	}
	if *dst == nil {
		*dst = map[string]string{}
	}
	return d.object(func(key []byte) error {
		k := d.text(key)
		var v string
		if err := d.str(&v); err != nil {
			return err
		}
		(*dst)[k] = v
		return nil
	})
}

func (d *decoder) boolean(dst *bool) error {
	switch {
	case d.null():
	case bytes.HasPrefix(d.b[d.i:], []byte("true")):
		d.i += 4
		*dst = true
	case bytes.HasPrefix(d.b[d.i:], []byte("false")):
		d.i += 5
		*dst = false
	default:
		return d.fail("expected a boolean")
	}
	return nil
}

func (d *decoder) boolPtr(dst **bool) error {
	if d.null() {
		*dst = nil
		return nil
	}
	v := new(bool)
	*dst = v
	return d.boolean(v)
}

// number returns the bytes of a number.
func (d *decoder) number() ([]byte, error) {
	d.ws()
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			d.i++
			continue
		}
		break
	}
	if start == d.i {
		return nil, d.fail("expected a number")
	}
	return d.b[start:d.i], nil
}

func (d *decoder) integer(bits int) (int64, bool, error) {
	if d.null() {
		return 0, false, nil
	}
	n, err := d.number()
	if err != nil {
		return 0, false, err
	}
	v, err := strconv.ParseInt(string(n), 10, bits)
	if err != nil {
		return 0, false, d.fail("number %s is not a %d-bit integer", n, bits)
	}
	return v, true, nil
}

func (d *decoder) int64Ptr(dst **int64) error {
	v, ok, err := d.integer(64)
	if ok {
		*dst = &v
	} else if err == nil {
		*dst = nil
	}
	return err
}

// raw skips a value and returns its bytes.
func (d *decoder) raw() ([]byte, error) {
	d.ws()
	start := d.i
	if err := d.skip(0); err != nil {
		return nil, err
	}
	return d.b[start:d.i], nil
}

// skip consumes any value, checking its syntax.
func (d *decoder) skip(depth int) error {
	if depth > 10000 {
		return d.fail("nested too deeply")
	}
	switch c := d.peek(); {
	case c == '{':
		return d.object(func([]byte) error { return d.skip(depth + 1) })
	case c == '[':
		return d.array(func() error { return d.skip(depth + 1) })
	case c == '"':
		_, err := d.rawString(nil)
		return err
	case c == 't' || c == 'f':
		var b bool
		return d.boolean(&b)
	case c == 'n':
		if !d.null() {
			return d.fail("invalid literal")
		}
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		n, err := d.number()
		if err == nil && !validNumber(n) {
			err = d.fail("invalid number %s", n)
		}
		return err
	default:
		return d.fail("unexpected character %q", c)
	}
}

// validNumber checks JSON's number grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(n []byte) bool {
	i := 0
	digits := func() bool {
		start := i
		for i < len(n) && n[i] >= '0' && n[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(n) && n[i] == '-' {
		i++
	}
	if i < len(n) && n[i] == '0' {
		i++
	} else if !digits() {
		return false
	}
	if i < len(n) && n[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(n) && (n[i] == 'e' || n[i] == 'E') {
		i++
		if i < len(n) && (n[i] == '+' || n[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(n)
}

// field returns which of names key is: the exact match, or else the first
// that matches ignoring case (as encoding/json does); "" if none.
func field(key []byte, names ...string) string {
	for _, n := range names {
		if string(key) == n {
			return n
		}
	}
	for _, n := range names {
		if len(key) == len(n) && bytes.EqualFold(key, []byte(n)) {
			return n
		}
	}
	return ""
}

// top decodes a whole input: one object and nothing after it.
func (d *decoder) top(member func(key []byte) error) error {
	if d.peek() != '{' {
		return d.fail("the input is not a JSON object")
	}
	if err := d.object(member); err != nil {
		return err
	}
	if d.peek() != 0 {
		return d.fail("data after the input's object")
	}
	return nil
}

func decodeAdmissionRequest(b []byte, r *AdmissionRequest) error {
	d := newDecoder(b)
	return d.top(func(key []byte) error {
		switch field(key, "pod", "node", "settings") {
		case "pod":
			return d.pod(&r.Pod)
		case "node":
			return d.node(&r.Node)
		case "settings":
			return d.settings(&r.Settings)
		}
		return d.skip(0)
	})
}

func decodeProbeRequest(b []byte, r *ProbeRequest) error {
	d := newDecoder(b)
	return d.top(func(key []byte) error {
		switch field(key, "pod", "container", "podIP", "ports", "settings") {
		case "pod":
			return d.pod(&r.Pod)
		case "container":
			return d.str(&r.Container)
		case "podIP":
			return d.str(&r.PodIP)
		case "ports":
			if d.null() {
				r.Ports = nil
				return nil
			}
			r.Ports = []int{}
			return d.array(func() error {
				v, _, err := d.integer(strconv.IntSize)
				r.Ports = append(r.Ports, int(v))
				return err
			})
		case "settings":
			return d.settings(&r.Settings)
		}
		return d.skip(0)
	})
}

// settings keeps the raw JSON (a copy: the input is the host's buffer), as
// encoding/json does for a json.RawMessage, null included.
func (d *decoder) settings(dst *json.RawMessage) error {
	raw, err := d.raw()
	if err == nil {
		*dst = bytes.Clone(raw)
	}
	return err
}

// rawMember returns the raw JSON of a top-level member of input.
func rawMember(input []byte, name string) (json.RawMessage, error) {
	d := &decoder{b: input}
	var out json.RawMessage
	err := d.top(func(key []byte) error {
		if field(key, name) == "" {
			return d.skip(0)
		}
		raw, err := d.raw()
		out = raw
		return err
	})
	return out, err
}

func (d *decoder) node(n *Node) error {
	return d.object(func(key []byte) error {
		switch field(key, "name", "labels", "allocatable") {
		case "name":
			return d.str(&n.Name)
		case "labels":
			return d.stringMap(&n.Labels)
		case "allocatable":
			return d.stringMap(&n.Allocatable)
		}
		return d.skip(0)
	})
}

func (d *decoder) pod(p *Pod) error {
	return d.object(func(key []byte) error {
		switch field(key, "apiVersion", "kind", "metadata", "spec") {
		case "apiVersion":
			return d.str(&p.APIVersion)
		case "kind":
			return d.str(&p.Kind)
		case "metadata":
			return d.object(func(key []byte) error {
				m := &p.Metadata
				switch field(key, "name", "namespace", "uid", "labels", "annotations") {
				case "name":
					return d.str(&m.Name)
				case "namespace":
					return d.str(&m.Namespace)
				case "uid":
					return d.str(&m.UID)
				case "labels":
					return d.stringMap(&m.Labels)
				case "annotations":
					return d.stringMap(&m.Annotations)
				}
				return d.skip(0)
			})
		case "spec":
			return d.podSpec(&p.Spec)
		}
		return d.skip(0)
	})
}

func (d *decoder) podSpec(s *PodSpec) error {
	return d.object(func(key []byte) error {
		switch field(key, "nodeName", "hostNetwork", "hostPID", "hostIPC", "serviceAccountName", "securityContext",
			"initContainers", "containers", "ephemeralContainers", "volumes") {
		case "nodeName":
			return d.str(&s.NodeName)
		case "hostNetwork":
			return d.boolean(&s.HostNetwork)
		case "hostPID":
			return d.boolean(&s.HostPID)
		case "hostIPC":
			return d.boolean(&s.HostIPC)
		case "serviceAccountName":
			return d.str(&s.ServiceAccountName)
		case "securityContext":
			if d.null() {
				s.SecurityContext = nil
				return nil
			}
			sc := &PodSecurityContext{}
			s.SecurityContext = sc
			return d.object(func(key []byte) error {
				switch field(key, "runAsUser", "runAsNonRoot") {
				case "runAsUser":
					return d.int64Ptr(&sc.RunAsUser)
				case "runAsNonRoot":
					return d.boolPtr(&sc.RunAsNonRoot)
				}
				return d.skip(0)
			})
		case "initContainers":
			return d.containers(&s.InitContainers)
		case "containers":
			return d.containers(&s.Containers)
		case "ephemeralContainers":
			return d.containers(&s.EphemeralContainers)
		case "volumes":
			return d.volumes(&s.Volumes)
		}
		return d.skip(0)
	})
}

func (d *decoder) containers(dst *[]Container) error {
	if d.null() {
		*dst = nil
		return nil
	}
	*dst = []Container{}
	return d.array(func() error {
		*dst = append(*dst, Container{})
		return d.container(&(*dst)[len(*dst)-1])
	})
}

func (d *decoder) container(c *Container) error {
	return d.object(func(key []byte) error {
		switch field(key, "name", "image", "command", "args", "ports", "resources", "securityContext") {
		case "name":
			return d.str(&c.Name)
		case "image":
			return d.str(&c.Image)
		case "command":
			return d.strings(&c.Command)
		case "args":
			return d.strings(&c.Args)
		case "ports":
			if d.null() {
				c.Ports = nil
				return nil
			}
			c.Ports = []ContainerPort{}
			return d.array(func() error {
				var p ContainerPort
				err := d.object(func(key []byte) error {
					switch field(key, "name", "containerPort", "protocol") {
					case "name":
						return d.str(&p.Name)
					case "containerPort":
						v, _, err := d.integer(32)
						p.ContainerPort = int32(v)
						return err
					case "protocol":
						return d.str(&p.Protocol)
					}
					return d.skip(0)
				})
				c.Ports = append(c.Ports, p)
				return err
			})
		case "resources":
			r := &c.Resources
			return d.object(func(key []byte) error {
				switch field(key, "limits", "requests") {
				case "limits":
					return d.stringMap(&r.Limits)
				case "requests":
					return d.stringMap(&r.Requests)
				}
				return d.skip(0)
			})
		case "securityContext":
			return d.securityContext(&c.SecurityContext)
		}
		return d.skip(0)
	})
}

func (d *decoder) securityContext(dst **SecurityContext) error {
	if d.null() {
		*dst = nil
		return nil
	}
	sc := &SecurityContext{}
	*dst = sc
	return d.object(func(key []byte) error {
		switch field(key, "privileged", "allowPrivilegeEscalation", "runAsUser", "runAsNonRoot", "readOnlyRootFilesystem", "capabilities") {
		case "privileged":
			return d.boolPtr(&sc.Privileged)
		case "allowPrivilegeEscalation":
			return d.boolPtr(&sc.AllowPrivilegeEscalation)
		case "runAsUser":
			return d.int64Ptr(&sc.RunAsUser)
		case "runAsNonRoot":
			return d.boolPtr(&sc.RunAsNonRoot)
		case "readOnlyRootFilesystem":
			return d.boolPtr(&sc.ReadOnlyRootFilesystem)
		case "capabilities":
			if d.null() {
				sc.Capabilities = nil
				return nil
			}
			caps := &Capabilities{}
			sc.Capabilities = caps
			return d.object(func(key []byte) error {
				switch field(key, "add", "drop") {
				case "add":
					return d.strings(&caps.Add)
				case "drop":
					return d.strings(&caps.Drop)
				}
				return d.skip(0)
			})
		}
		return d.skip(0)
	})
}

func (d *decoder) volumes(dst *[]Volume) error {
	if d.null() {
		*dst = nil
		return nil
	}
	*dst = []Volume{}
	return d.array(func() error {
		var v Volume
		err := d.object(func(key []byte) error {
			switch field(key, "name", "hostPath") {
			case "name":
				return d.str(&v.Name)
			case "hostPath":
				if d.null() {
					v.HostPath = nil
					return nil
				}
				hp := &HostPathVolumeSource{}
				v.HostPath = hp
				return d.object(func(key []byte) error {
					switch field(key, "path", "type") {
					case "path":
						return d.str(&hp.Path)
					case "type":
						return d.str(&hp.Type)
					}
					return d.skip(0)
				})
			}
			return d.skip(0)
		})
		*dst = append(*dst, v)
		return err
	})
}
