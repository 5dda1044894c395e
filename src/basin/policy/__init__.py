"""basin.policy"""
