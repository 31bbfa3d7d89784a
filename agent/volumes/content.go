package volumes

import (
	"context"
	"errors"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The API's default file mode of configMap, secret, downwardAPI and projected volumes. Static
// pods are not defaulted by the API, so it is applied here too.
const defaultFileMode int32 = 0o644

// contentPayload computes the files of a configMap, secret, downwardAPI or projected volume from
// the API objects it projects.
func (m *Manager) contentPayload(ctx context.Context, pod *v1.Pod, vol *v1.Volume) (map[string]file, error) {
	switch {
	case vol.ConfigMap != nil:
		src := vol.ConfigMap
		optional := src.Optional != nil && *src.Optional
		cm, err := m.configMapOrEmpty(ctx, pod, src.Name, optional)
		if err != nil {
			return nil, err
		}
		return configMapPayload(src.Items, cm, modeOr(src.DefaultMode), optional)
	case vol.Secret != nil:
		src := vol.Secret
		optional := src.Optional != nil && *src.Optional
		s, err := m.secretOrEmpty(ctx, pod, src.SecretName, optional)
		if err != nil {
			return nil, err
		}
		return secretPayload(src.Items, s, modeOr(src.DefaultMode), optional)
	case vol.DownwardAPI != nil:
		return downwardPayload(vol.DownwardAPI.Items, pod, modeOr(vol.DownwardAPI.DefaultMode), m.Allocatable())
	case vol.Projected != nil:
		return m.projectedPayload(ctx, pod, vol.Projected)
	}
	return nil, fmt.Errorf("volume %q has no content source", vol.Name)
}

func modeOr(m *int32) int32 {
	if m != nil {
		return *m
	}
	return defaultFileMode
}

func (m *Manager) configMapOrEmpty(ctx context.Context, pod *v1.Pod, name string, optional bool) (*v1.ConfigMap, error) {
	cm, err := m.ConfigMap(ctx, pod, name)
	if apierrors.IsNotFound(err) && optional {
		return &v1.ConfigMap{}, nil
	}
	return cm, err
}

func (m *Manager) secretOrEmpty(ctx context.Context, pod *v1.Pod, name string, optional bool) (*v1.Secret, error) {
	s, err := m.Secret(ctx, pod, name)
	if apierrors.IsNotFound(err) && optional {
		return &v1.Secret{}, nil
	}
	return s, err
}

// configMapPayload is kubelet's: every key (data and binaryData) when items is empty, else the
// listed keys at their paths; a listed key that is missing is an error unless optional.
func configMapPayload(items []v1.KeyToPath, cm *v1.ConfigMap, defaultMode int32, optional bool) (map[string]file, error) {
	out := make(map[string]file, len(cm.Data)+len(cm.BinaryData))
	if len(items) == 0 {
		for k, v := range cm.Data {
			out[k] = file{data: []byte(v), mode: os.FileMode(defaultMode)}
		}
		for k, v := range cm.BinaryData {
			out[k] = file{data: v, mode: os.FileMode(defaultMode)}
		}
		return out, nil
	}
	for _, it := range items {
		var data []byte
		if s, ok := cm.Data[it.Key]; ok {
			data = []byte(s)
		} else if b, ok := cm.BinaryData[it.Key]; ok {
			data = b
		} else {
			if optional {
				continue
			}
			return nil, fmt.Errorf("configmap references non-existent config key: %s", it.Key)
		}
		out[it.Path] = file{data: data, mode: os.FileMode(modeOrDefault(it.Mode, defaultMode))}
	}
	return out, nil
}

// secretPayload is configMapPayload for Secrets.
func secretPayload(items []v1.KeyToPath, s *v1.Secret, defaultMode int32, optional bool) (map[string]file, error) {
	out := make(map[string]file, len(s.Data))
	if len(items) == 0 {
		for k, v := range s.Data {
			out[k] = file{data: v, mode: os.FileMode(defaultMode)}
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := s.Data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("references non-existent secret key: %s", it.Key)
		}
		out[it.Path] = file{data: v, mode: os.FileMode(modeOrDefault(it.Mode, defaultMode))}
	}
	return out, nil
}

func modeOrDefault(m *int32, def int32) int32 {
	if m != nil {
		return *m
	}
	return def
}

// projectedPayload merges the sources in order, a later path replacing an earlier one.
func (m *Manager) projectedPayload(ctx context.Context, pod *v1.Pod, p *v1.ProjectedVolumeSource) (map[string]file, error) {
	mode := modeOr(p.DefaultMode)
	out := map[string]file{}
	var errs []error
	for _, src := range p.Sources {
		var part map[string]file
		var err error
		switch {
		case src.ConfigMap != nil:
			optional := src.ConfigMap.Optional != nil && *src.ConfigMap.Optional
			var cm *v1.ConfigMap
			if cm, err = m.configMapOrEmpty(ctx, pod, src.ConfigMap.Name, optional); err == nil {
				part, err = configMapPayload(src.ConfigMap.Items, cm, mode, optional)
			}
		case src.Secret != nil:
			optional := src.Secret.Optional != nil && *src.Secret.Optional
			var s *v1.Secret
			if s, err = m.secretOrEmpty(ctx, pod, src.Secret.Name, optional); err == nil {
				part, err = secretPayload(src.Secret.Items, s, mode, optional)
			}
		case src.DownwardAPI != nil:
			part, err = downwardPayload(src.DownwardAPI.Items, pod, mode, m.Allocatable())
		case src.ServiceAccountToken != nil:
			var token string
			if token, err = m.serviceAccountToken(ctx, pod, src.ServiceAccountToken); err == nil {
				// As kubelet: with fsGroup the token is 0600, and fsGroup makes it 0640.
				tokenMode := os.FileMode(mode)
				if fsGroupOf(pod) != nil {
					tokenMode = 0o600
				}
				part = map[string]file{src.ServiceAccountToken.Path: {data: []byte(token), mode: tokenMode}}
			}
		case src.ClusterTrustBundle != nil:
			err = errors.New("clusterTrustBundle projections are not supported by holdfast")
		case src.PodCertificate != nil:
			err = errors.New("podCertificate projections are not supported by holdfast")
		default:
			err = errors.New("projected volume source of an unknown kind")
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for k, v := range part {
			out[k] = v
		}
	}
	return out, errors.Join(errs...)
}
