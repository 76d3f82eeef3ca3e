"""Files and safety: typed JSON files (`typedfile`), atomic writes and the cache folder (`atomic`), folders clbench
owns and files it reads that others may have written (`safety`), saved state that cannot carry code
(`safestate`), and escaping of untrusted text (`escape`).
"""
