package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/wasm"
)

// ConfigFileName is the name of the configuration file in the policies
// directory.
const ConfigFileName = "policies.yaml"

// ConfigAPIVersion and ConfigKind identify the file's format.
const (
	ConfigAPIVersion = "holdfast.dev/v1alpha1"
	ConfigKind       = "PolicyConfig"
)

// probeTimeoutCap bounds a probe call when the policy sets no
// limits.timeout; the probe's own timeoutSeconds is normally shorter.
const probeTimeoutCap = 5 * time.Minute

// maxConfigBytes bounds the configuration file; it is read whole.
const maxConfigBytes = 1 << 20

// Kind is what a policy decides.
type Kind string

const (
	// KindAdmission policies export admit and judge pods before they run.
	KindAdmission Kind = "admission"
	// KindProbe policies export probe and judge a container's health.
	KindProbe Kind = "probe"
	// KindOPA policies are Rego compiled by `opa build -t wasm`, judging pods
	// before they run as admission policies do (see opa.go).
	KindOPA Kind = "opa"
)

// FailurePolicy says what a module error (a trap, a timeout, a module that
// could not be loaded) means.
type FailurePolicy string

const (
	// Fail: an admission error denies the pod; a probe error fails the probe.
	Fail FailurePolicy = "Fail"
	// Ignore: an admission error skips the policy (with a warning); a probe
	// error counts as success.
	Ignore FailurePolicy = "Ignore"
)

// Config is the content of policies.yaml.
type Config struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Policies   []PolicyConfig `json:"policies"`
}

// PolicyConfig configures one policy. Its Module may also be a module
// delivered from a registry, pinned by the digest of its OCI manifest:
// oci://HOST[:PORT]/REPO@sha256:HEX (see oci.go).
type PolicyConfig struct {
	// Name identifies the policy in decisions, events and probe
	// annotations: lowercase letters, digits and '-', at most 63.
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Module is the .wasm file, relative to the policies directory or
	// absolute; for kind opa, the bundle `opa build -t wasm` wrote (or its
	// policy.wasm alone).
	Module string `json:"module"`
	// Entrypoint is the Rego rule a kind opa policy evaluates, as given to
	// opa build -e ("kubernetes/admission/deny"); it may be left out when
	// the bundle has only one.
	Entrypoint string `json:"entrypoint,omitempty"`
	// FailurePolicy defaults to Fail.
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`
	// Settings are handed to the module with every call.
	Settings json.RawMessage `json:"settings,omitempty"`
	Grants   Grants          `json:"grants,omitempty"`
	Limits   Limits          `json:"limits,omitempty"`
}

// Grants are the capabilities of a policy beyond logging.
type Grants struct {
	// HTTP allows HTTP requests to the probed pod's IP and ports.
	HTTP bool `json:"http,omitempty"`
	// TCP allows TCP connections to the probed pod's IP and ports.
	TCP bool `json:"tcp,omitempty"`
	// Files lists path prefixes inside the container that the policy may
	// read (e.g. "/run/app"); non-empty grants file access.
	Files []string `json:"files,omitempty"`
	// Clock gives the real clock instead of a fake, deterministic one.
	Clock bool `json:"clock,omitempty"`
}

// Limits bound one policy. Zero fields take the engine's defaults.
type Limits struct {
	// Timeout bounds a call, e.g. "2s". Admission defaults to
	// Options.AdmissionTimeout. For probes the probe's own timeoutSeconds
	// applies too and the shorter wins; without Timeout it alone applies
	// (capped at 5 minutes).
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// Memory caps each instance's memory, e.g. "64Mi".
	Memory *resource.Quantity `json:"memory,omitempty"`
	// MaxInstances is how many calls of this policy may run at once.
	MaxInstances int `json:"maxInstances,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ParseConfig parses and validates policies.yaml. Unknown fields are
// errors: a misspelt grant must not silently be no grant.
func ParseConfig(b []byte) (*Config, error) {
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit", ConfigFileName, len(b), maxConfigBytes)
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", ConfigFileName, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// ReadConfig reads dir/policies.yaml. A missing file is an empty
// configuration.
func ReadConfig(dir string) (*Config, error) {
	f, err := os.Open(filepath.Join(dir, ConfigFileName))
	if errors.Is(err, os.ErrNotExist) {
		return &Config{APIVersion: ConfigAPIVersion, Kind: ConfigKind}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	return ParseConfig(b)
}

// Validate checks a configuration and fills defaults.
func (c *Config) Validate() error {
	if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
		return fmt.Errorf("%s: apiVersion/kind is %q/%q, want %q/%q", ConfigFileName, c.APIVersion, c.Kind, ConfigAPIVersion, ConfigKind)
	}
	seen := map[string]bool{}
	var errs []error
	for i := range c.Policies {
		p := &c.Policies[i]
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("policies[%d] (%q): %w", i, p.Name, err))
			continue
		}
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("policies[%d]: duplicate name %q", i, p.Name))
		}
		seen[p.Name] = true
	}
	return errors.Join(errs...)
}

func (p *PolicyConfig) validate() error {
	if !nameRE.MatchString(p.Name) {
		return fmt.Errorf("name must be lowercase letters, digits and '-', at most 63 characters")
	}
	switch p.Kind {
	case KindAdmission, KindProbe, KindOPA:
	default:
		return fmt.Errorf("kind %q must be %q, %q or %q", p.Kind, KindAdmission, KindProbe, KindOPA)
	}
	if p.Entrypoint != "" && p.Kind != KindOPA {
		return fmt.Errorf("entrypoint is for kind %q policies; a %s module exports %q", KindOPA, p.Kind, entrypoint(p.Kind))
	}
	if p.Module == "" {
		return fmt.Errorf("module is empty")
	}
	if isOCI(p.Module) {
		if _, err := parseOCIRef(p.Module); err != nil {
			return err
		}
	}
	switch p.FailurePolicy {
	case "":
		p.FailurePolicy = Fail
	case Fail, Ignore:
	default:
		return fmt.Errorf("failurePolicy %q must be %q or %q", p.FailurePolicy, Fail, Ignore)
	}
	if len(p.Settings) > 0 && !json.Valid(p.Settings) {
		return fmt.Errorf("settings are not valid JSON")
	}
	if p.Kind == KindOPA {
		if len(p.Settings) > 0 && !isJSONObject(p.Settings) {
			return fmt.Errorf("settings of a kind %q policy are merged into its data document, so they must be an object", KindOPA)
		}
		if p.Grants.HTTP || p.Grants.TCP || len(p.Grants.Files) > 0 || p.Grants.Clock {
			return fmt.Errorf("a kind %q policy gets no grants: its module reaches nothing but the built-in functions holdfast provides", KindOPA)
		}
	}
	if p.Kind == KindAdmission && (p.Grants.HTTP || p.Grants.TCP || len(p.Grants.Files) > 0) {
		return ErrAdmissionGrants
	}
	for _, f := range p.Grants.Files {
		if len(f) == 0 || f[0] != '/' {
			return fmt.Errorf("grants.files entry %q must be an absolute path inside the container", f)
		}
	}
	if p.Limits.Timeout.Duration < 0 {
		return fmt.Errorf("limits.timeout is negative")
	}
	if m := p.Limits.Memory; m != nil {
		if m.Value() < 64<<10 || m.Value() > 4<<30 {
			return fmt.Errorf("limits.memory %s must be between 64Ki and 4Gi", m)
		}
	}
	if p.Limits.MaxInstances < 0 {
		return fmt.Errorf("limits.maxInstances is negative")
	}
	return nil
}

// ErrAdmissionGrants refuses an admission policy the grants of a probe.
var ErrAdmissionGrants = errors.New("an admission policy judges a pod before it runs: it has no pod IP to reach and no files to read, so grants http, tcp and files are for probes only")

// wasmGrants translates the configuration's grants.
func (p *PolicyConfig) wasmGrants() []wasm.Grant {
	var g []wasm.Grant
	if p.Grants.HTTP {
		g = append(g, wasm.GrantHTTP)
	}
	if p.Grants.TCP {
		g = append(g, wasm.GrantTCP)
	}
	if len(p.Grants.Files) > 0 {
		g = append(g, wasm.GrantFile)
	}
	if p.Grants.Clock {
		g = append(g, wasm.GrantClock)
	}
	return g
}

// wasmLimits translates the configuration's limits.
func (p *PolicyConfig) wasmLimits(defaultTimeout time.Duration) wasm.Limits {
	l := wasm.Limits{CallTimeout: p.Limits.Timeout.Duration, MaxInstances: p.Limits.MaxInstances}
	if l.CallTimeout == 0 {
		switch p.Kind {
		case KindAdmission, KindOPA:
			l.CallTimeout = defaultTimeout
		case KindProbe:
			// The probe's timeoutSeconds, carried by the caller's context,
			// governs; this only bounds a caller that forgot it.
			l.CallTimeout = probeTimeoutCap
		}
	}
	if m := p.Limits.Memory; m != nil {
		l.MemoryPages = uint32(math.Ceil(float64(m.Value()) / 65536))
	}
	return l
}

// isJSONObject reports whether b (valid JSON) is an object.
func isJSONObject(b []byte) bool {
	var obj map[string]json.RawMessage
	return json.Unmarshal(b, &obj) == nil && obj != nil
}
