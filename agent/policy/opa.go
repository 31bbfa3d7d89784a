package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/wasm"
)

// An OPA policy (kind: opa) is Rego compiled by Open Policy Agent, `opa build
// -t wasm -e ENTRYPOINT`, taken as it is: the bundle that command writes (a
// .tar.gz with /policy.wasm, /data.json and /.manifest) or its policy.wasm
// alone. It is an admission policy: the entrypoint is evaluated with an
// AdmissionReview of the pod as input (input.request.object is the pod, as
// for Kubernetes' admission webhooks and OPA's kube-mgmt) and the node as
// input.node, and its value decides:
//
//   - a set or array of messages (deny contains msg if ...): allowed if
//     empty, denied with the messages otherwise; an element may be an object
//     with "msg" (Gatekeeper's violation style);
//   - a boolean (allow): true allows, false denies;
//   - an object with "allowed" (an AdmissionReview response, alone or as
//     "response" of a whole AdmissionReview): its status.message (or
//     message) and status.reason (or reason) explain a denial.
//
// Anything else, and an undefined entrypoint (a complete rule without a
// default), is a policy error: its failurePolicy applies.

// OPABundle is what holdfast takes from a policy OPA built.
type OPABundle struct {
	// Wasm is the module, /policy.wasm.
	Wasm []byte
	// Data is the data document (JSON object) assembled from the bundle's
	// data.json files; nil if none.
	Data []byte
	// Entrypoints are those the manifest lists for the module.
	Entrypoints []string
}

// maxBundleFiles bounds the entries of a bundle (a small archive in
// practice: the module, its data, its manifest and its sources).
const maxBundleFiles = 10000

// ReadOPABundle reads b, a bundle written by `opa build -t wasm` or a bare
// policy.wasm, within maxModuleBytes uncompressed.
func ReadOPABundle(b []byte) (*OPABundle, error) {
	if bytes.HasPrefix(b, []byte("\x00asm")) {
		return &OPABundle{Wasm: b}, nil
	}
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		return nil, errors.New("neither a bundle (.tar.gz, opa build -t wasm) nor a Wasm module")
	}
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(gz, maxModuleBytes+1))
	var bundle OPABundle
	data := map[string]any{}
	var manifest struct {
		Wasm []struct {
			Entrypoint string `json:"entrypoint"`
			Module     string `json:"module"`
		} `json:"wasm"`
	}
	hasData := false
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("bundle: %w", err)
		}
		if n >= maxBundleFiles {
			return nil, fmt.Errorf("bundle: more than %d files", maxBundleFiles)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		name := path.Clean("/" + hdr.Name)
		body, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("bundle: %s: %w", name, err)
		}
		switch {
		case name == "/policy.wasm":
			bundle.Wasm = body
		case name == "/.manifest":
			if err := json.Unmarshal(body, &manifest); err != nil {
				return nil, fmt.Errorf("bundle: .manifest: %w", err)
			}
		case path.Base(name) == "data.json":
			var doc any
			if err := json.Unmarshal(body, &doc); err != nil {
				return nil, fmt.Errorf("bundle: %s: %w", name, err)
			}
			if err := setDataPath(data, path.Dir(name), doc); err != nil {
				return nil, fmt.Errorf("bundle: %s: %w", name, err)
			}
			hasData = true
		case strings.HasSuffix(name, ".wasm"):
			return nil, fmt.Errorf("bundle: %s: holdfast evaluates bundles of one module, /policy.wasm", name)
		}
	}
	if bundle.Wasm == nil {
		return nil, errors.New("bundle has no /policy.wasm: build it with opa build -t wasm")
	}
	for _, w := range manifest.Wasm {
		bundle.Entrypoints = append(bundle.Entrypoints, w.Entrypoint)
	}
	if hasData {
		bundle.Data, _ = json.Marshal(data)
	}
	return &bundle, nil
}

// setDataPath puts doc at dir ("/" or "/a/b") in data, as OPA does with a
// bundle's data files: objects meeting at one path are merged, and any other
// value meeting another at one path is a conflict, whatever the order the
// files come in.
func setDataPath(data map[string]any, dir string, doc any) error {
	conflict := fmt.Errorf("data at %s conflicts with another data file", dir)
	if dir == "/" {
		obj, ok := doc.(map[string]any)
		if !ok {
			return errors.New("the root data.json is not an object")
		}
		if !mergeData(data, obj) {
			return conflict
		}
		return nil
	}
	// Wrap doc in objects down from the root, then merge it in.
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	wrapped := doc
	for i := len(parts) - 1; i >= 0; i-- {
		wrapped = map[string]any{parts[i]: wrapped}
	}
	if !mergeData(data, wrapped.(map[string]any)) {
		return conflict
	}
	return nil
}

// mergeData merges src into dst: keys of both whose values are objects are
// merged in turn; any other key present in both is a conflict (false).
func mergeData(dst, src map[string]any) bool {
	for k, v := range src {
		old, taken := dst[k]
		if !taken {
			dst[k] = v
			continue
		}
		a, aObj := old.(map[string]any)
		b, bObj := v.(map[string]any)
		if !aObj || !bObj || !mergeData(a, b) {
			return false
		}
	}
	return true
}

// opaSpec is what the engine loads for an OPA policy: the bundle's module
// and its data document, the policy's settings merged over the data's top
// level.
func opaSpec(pc PolicyConfig, file []byte, timeout time.Duration) (wasm.Spec, error) {
	bundle, err := ReadOPABundle(file)
	if err != nil {
		return wasm.Spec{}, err
	}
	entrypoint := pc.Entrypoint
	if entrypoint == "" {
		switch len(bundle.Entrypoints) {
		case 0:
			return wasm.Spec{}, errors.New("no entrypoint configured, and no bundle manifest names one: set the policy's entrypoint (the -e of opa build)")
		case 1:
		default:
			return wasm.Spec{}, fmt.Errorf("no entrypoint configured, and the bundle has %d (%s): name one in the policy's entrypoint", len(bundle.Entrypoints), strings.Join(bundle.Entrypoints, ", "))
		}
		entrypoint = bundle.Entrypoints[0]
	}
	data := bundle.Data
	if len(pc.Settings) > 0 {
		doc := map[string]any{}
		if len(data) > 0 {
			if err := json.Unmarshal(data, &doc); err != nil {
				return wasm.Spec{}, fmt.Errorf("data document: %w", err)
			}
		}
		var settings map[string]any
		if err := json.Unmarshal(pc.Settings, &settings); err != nil {
			return wasm.Spec{}, fmt.Errorf("settings: %w", err)
		}
		for k, v := range settings {
			doc[k] = v
		}
		if data, err = json.Marshal(doc); err != nil {
			return wasm.Spec{}, err
		}
	}
	return wasm.Spec{
		Name:        pc.Name,
		Wasm:        bundle.Wasm,
		ABI:         wasm.ABIOPA,
		Data:        data,
		Limits:      pc.wasmLimits(timeout),
		Entrypoints: []string{entrypoint},
	}, nil
}

// opaInput is the AdmissionReview an OPA policy judges a pod by.
func opaInput(podJSON, nodeJSON []byte, pod *corev1.Pod) []byte {
	req, _ := json.Marshal(map[string]any{
		"uid":       string(pod.UID),
		"kind":      map[string]string{"group": "", "version": "v1", "kind": "Pod"},
		"resource":  map[string]string{"group": "", "version": "v1", "resource": "pods"},
		"name":      pod.Name,
		"namespace": pod.Namespace,
		"operation": "CREATE",
		"dryRun":    false,
	})
	// The pod is spliced in as encoded once for every policy.
	req = append(req[:len(req)-1], `,"object":`...)
	req = append(req, podJSON...)
	req = append(req, '}')
	return compose(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":`, req, `,"node":`, nodeJSON, `}`)
}

// decodeOPAResult turns an OPA result set into an admission decision.
func decodeOPAResult(entrypoint string, out []byte) (admissionOutput, error) {
	var set []map[string]json.RawMessage
	if err := json.Unmarshal(out, &set); err != nil {
		return admissionOutput{}, fmt.Errorf("result set %.100q: %w", out, err)
	}
	if len(set) == 0 {
		return admissionOutput{}, fmt.Errorf("entrypoint %s is undefined for this pod: give its rule a default (default allow := false) or make it a set of messages (deny contains msg if ...)", entrypoint)
	}
	raw, ok := set[0]["result"]
	if !ok {
		return admissionOutput{}, fmt.Errorf("result set %.100q has no result", out)
	}
	return decodeOPAValue(entrypoint, raw, 0)
}

func decodeOPAValue(entrypoint string, raw json.RawMessage, depth int) (admissionOutput, error) {
	yes, no := true, false
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return admissionOutput{}, err
	}
	switch v := v.(type) {
	case bool:
		if v {
			return admissionOutput{Allowed: &yes}, nil
		}
		return admissionOutput{Allowed: &no, Message: fmt.Sprintf("%s is false", entrypoint)}, nil
	case []any:
		if len(v) == 0 {
			return admissionOutput{Allowed: &yes}, nil
		}
		msgs := make([]string, 0, len(v))
		for _, e := range v {
			msgs = append(msgs, opaMessage(e))
		}
		return admissionOutput{Allowed: &no, Message: strings.Join(msgs, "; ")}, nil
	case map[string]any:
		if resp, ok := v["response"].(map[string]any); ok && depth == 0 {
			b, _ := json.Marshal(resp)
			return decodeOPAValue(entrypoint, b, depth+1)
		}
		allowed, ok := v["allowed"].(bool)
		if !ok {
			break
		}
		res := admissionOutput{Allowed: &allowed}
		res.Message, _ = v["message"].(string)
		res.Reason, _ = v["reason"].(string)
		if st, ok := v["status"].(map[string]any); ok {
			if m, ok := st["message"].(string); ok && res.Message == "" {
				res.Message = m
			}
			if r, ok := st["reason"].(string); ok && res.Reason == "" {
				res.Reason = r
			}
		}
		if w, ok := v["warnings"].([]any); ok {
			for _, x := range w {
				res.Warnings = append(res.Warnings, opaMessage(x))
			}
		}
		return res, nil
	}
	return admissionOutput{}, fmt.Errorf("entrypoint %s is %.100s: an OPA admission policy's value must be a set of messages, a boolean, or an object with \"allowed\"", entrypoint, raw)
}

// opaMessage is a deny message: a string, a violation's "msg", or the JSON.
func opaMessage(e any) string {
	switch e := e.(type) {
	case string:
		return e
	case map[string]any:
		if m, ok := e["msg"].(string); ok {
			return m
		}
	}
	b, _ := json.Marshal(e)
	return string(b)
}
